#include "worker/train/op_profile.h"

#include <fmt/format.h>

#include <fstream>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"

namespace dlaunch::train {

OpProfile::OpProfile(kernels::Backend& device) : device_(device) {
  file_ = get_env("DTRAIN_PROFILE_OPS").value_or("");
  if (file_.empty()) return;
  const int64_t skip = get_env_int("DTRAIN_PROFILE_OPS_SKIP").value_or(5);
  if (skip < 0) {
    throw UsageError(fmt::format("DTRAIN_PROFILE_OPS_SKIP={} is negative; expected the number of warm-up "
                                 "steps to leave out, e.g. 5",
                                 skip));
  }
  timing_ = std::make_unique<kernels::OpTimingBackend>(device, skip);
  log_info("DTRAIN_PROFILE_OPS: every op waits for the device before and after itself (slower training); "
           "the table goes to {} after {} warm-up step(s)",
           file_, skip);
}

void OpProfile::write(int rank) const {
  if (!timing_) return;
  const std::string path = rank == 0 ? file_ : fmt::format("{}.rank{}", file_, rank);
  std::ofstream out(path);
  out << timing_->report();
  if (!out) {
    log_warning("DTRAIN_PROFILE_OPS: could not write {}", path);
    return;
  }
  log_info("DTRAIN_PROFILE_OPS: op times of {} step(s) written to {}", timing_->steps_counted(), path);
}

}  // namespace dlaunch::train
