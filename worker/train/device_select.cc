#include "worker/train/device_select.h"

#include <fmt/format.h>

#include "common/error.h"
#include "common/log.h"
#include "kernels/device.h"

namespace dlaunch::train {

kernels::OpenedDevice select_device(const TrainConfig& config, const WorkerEnv& env) {
  const kernels::OpenedDevice opened =
      kernels::open_device(kernels::parse_device_request(config.device), env.local_rank);
  log_info("device: {}", opened.description);
  kernels::Backend& backend = *opened.backend;
  if (config.precision != "fp32") {
    if (backend.host_accessible()) {
      throw UsageError(fmt::format(
          "--precision {} is not available on the CPU: the CPU backend computes in fp32 only; "
          "run with --precision fp32 (or on a GPU once its {} kernels exist)",
          config.precision, config.precision));
    }
    throw UsageError(fmt::format(
        "--precision {} is not implemented on CUDA yet: the CUDA kernels compute in fp32 only "
        "(mixed precision is issue 10, item 3); run with --precision fp32",
        config.precision));
  }
  return opened;
}

}  // namespace dlaunch::train
