// DTRAIN_PROFILE_OPS=FILE: dtrain trains on kernels::OpTimingBackend around its device and writes
// the per-op table to FILE when training ends (FILE.rank<N> on ranks other than 0), after skipping
// DTRAIN_PROFILE_OPS_SKIP training steps (default 5) of warm-up. Each op then waits for the device
// before and after itself, which slows training: for benchmarks (bench/gpu/gpu_bench.py's profile
// section), never for a real run. Unset: training uses the device's backend directly.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"
#include "kernels/op_timing_backend.h"

namespace dlaunch::train {

class OpProfile {
 public:
  explicit OpProfile(kernels::Backend& device);  // reads the two variables
  // The backend to train on: the timing wrapper when asked for, else `device`.
  kernels::Backend& backend() { return timing_ ? *timing_ : device_; }
  // Writes the table when asked for; a file that cannot be written is a warning.
  void write(int rank) const;

 private:
  kernels::Backend& device_;
  std::string file_;
  std::unique_ptr<kernels::OpTimingBackend> timing_;
};

}  // namespace dlaunch::train
