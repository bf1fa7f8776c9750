// dtrain's --device: opens the backend this worker trains on (kernels/device.h: auto|cpu|cuda,
// GPU LOCAL_RANK among the visible ones) and says which in the start-up log. --precision is
// honoured on every backend (train/precision.h).
// Blocks while a GPU initialises; throws UsageError (dtrain exits 2) for --device cuda without a
// usable GPU, with the sentence device.h describes.
#pragma once

#include "common/worker_env.h"
#include "kernels/device.h"
#include "worker/train/train_config.h"

namespace dlaunch::train {

// The opened device (its backend, and the GPU index for the process group's choice).
kernels::OpenedDevice select_device(const TrainConfig& config, const WorkerEnv& env);

}  // namespace dlaunch::train
