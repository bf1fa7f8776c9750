#include "worker/train/device_select.h"

#include "common/log.h"
#include "kernels/device.h"

namespace dlaunch::train {

kernels::OpenedDevice select_device(const TrainConfig& config, const WorkerEnv& env) {
  const kernels::OpenedDevice opened =
      kernels::open_device(kernels::parse_device_request(config.device), env.local_rank);
  log_info("device: {}", opened.description);
  return opened;
}

}  // namespace dlaunch::train
