// dtrain's --device: opens the backend this worker trains on (kernels/device.h: auto|cpu|cuda,
// GPU LOCAL_RANK among the visible ones) and says which in the start-up log.
// Blocks while a GPU initialises; throws UsageError (dtrain exits 2) for --device cuda without a
// usable GPU, with the sentence device.h describes.
#pragma once

#include "common/worker_env.h"
#include "kernels/backend.h"
#include "worker/train/train_config.h"

namespace dlaunch::train {

kernels::Backend& select_device(const TrainConfig& config, const WorkerEnv& env);

}  // namespace dlaunch::train
