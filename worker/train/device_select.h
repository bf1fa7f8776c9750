// dtrain's --device and --precision: opens the backend this worker trains on (kernels/device.h:
// auto|cpu|cuda, GPU LOCAL_RANK among the visible ones), says which in the start-up log, and
// refuses a --precision the chosen device cannot honour.
//
// Precision today: every backend computes in fp32. --precision bf16|fp16 is refused with
// UsageError on the CPU (its kernels are fp32 only, by choice: oneDNN's bf16 needs AVX-512 BF16
// to be faster) and on CUDA (the CUDA kernels have no bf16/fp16 variants yet; issue 10 item 3).
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
