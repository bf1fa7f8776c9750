// --data_on_device auto|on|off: whether the training and test splits live on the compute device
// as uint8 (uploaded once per worker process, batches made there by the augment_batch op, only the
// sample indices copied per step; epoch_batches.h) or stay with the host loader (batches
// assembled by a loader thread and copied over as floats).
//
//   off:  the host loader.
//   on:   the device, also on the CPU backend (where it exercises the same path end to end);
//         UsageError when a split cannot be made there (images of their own sizes, or decoded
//         each epoch).
//   auto: the device on a GPU when the splits qualify and together take at most
//         kDataOnDeviceMaxBytes; the host loader on the CPU, where its thread overlaps with
//         the step and the op would take the step's own cores.
// Pure: no I/O.
#pragma once

#include <cstdint>
#include <string>

#include "worker/data/dataset.h"

namespace dlaunch::train {

// CIFAR-10 takes 176 MiB as uint8 and MNIST 52 MiB; 2 GiB leaves an 80 GB GPU's memory to the
// model and bounds the upload at start to about a second.
inline constexpr int64_t kDataOnDeviceMaxBytes = int64_t{2} << 30;

struct DataPlacement {
  bool on_device = false;
  std::string
      reason;  // for the start-up log: why, e.g. "--data_on_device auto: 175.8 MiB <= 2048 MiB"
};

// `mode` is auto|on|off (train_config checked it); `host_device` says the backend is the CPU;
// auto keeps splits of at most `max_bytes` together on a GPU.
DataPlacement choose_data_placement(const std::string& mode, bool host_device,
                                    const data::ImageDataset& train, const data::ImageDataset& test,
                                    int64_t max_bytes = kDataOnDeviceMaxBytes);

}  // namespace dlaunch::train
