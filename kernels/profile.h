// Optional per-op wall-clock accounting for benchmarks (bench_train_step --profile). Off by
// default: a disabled ScopedOpTimer costs one relaxed atomic load. Thread-safe; the totals are
// process-wide.
#pragma once

#include <chrono>
#include <string>

namespace dlaunch::kernels {

void set_profiling(bool on);
bool profiling();
void profile_add(const char* op, double seconds);
// One line per op, slowest first: "op  calls  total_ms  share%". Clears the totals when reset.
std::string profile_report(bool reset);

class ScopedOpTimer {
 public:
  explicit ScopedOpTimer(const char* op) : op_(profiling() ? op : nullptr) {
    if (op_) start_ = std::chrono::steady_clock::now();
  }
  ~ScopedOpTimer() {
    if (op_)
      profile_add(op_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  ScopedOpTimer(const ScopedOpTimer&) = delete;
  ScopedOpTimer& operator=(const ScopedOpTimer&) = delete;

 private:
  const char* op_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace dlaunch::kernels
