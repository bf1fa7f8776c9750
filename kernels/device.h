// Choosing the backend dtrain trains on (--device auto|cpu|cuda) and opening it.
//
// The CUDA backend is a plugin (kernels/cuda_plugin.h), looked for at $DLAUNCH_CUDA_PLUGIN when
// set, else beside the running executable (libdlaunch_cuda.so), else in ../lib/dlaunch/ from
// it. A worker takes device LOCAL_RANK among the devices the CUDA runtime sees (it honours
// CUDA_VISIBLE_DEVICES); with more local workers than devices, workers share devices round-robin
// (local_rank % count), which is said in the description.
//
//   auto: CUDA when the plugin loads and the runtime sees a device, else the CPU;
//   cpu:  the CPU;
//   cuda: CUDA, or UsageError (dtrain exits 2) with one sentence saying what was looked for
//         and what was found, e.g. "--device cuda needs a usable NVIDIA GPU: looked for one
//         through the CUDA runtime in .../libdlaunch_cuda.so with CUDA_VISIBLE_DEVICES unset
//         and found none (cudaGetDeviceCount failed: ...); use --device cpu or auto".
//
// Blocks while the plugin loads and the device initialises (a second or two on a GPU).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/backend.h"

namespace dlaunch::kernels {

enum class DeviceRequest { kAuto, kCpu, kCuda };

// "auto" | "cpu" | "cuda"; throws UsageError naming the allowed values otherwise.
DeviceRequest parse_device_request(const std::string& text);

struct OpenedDevice {
  Backend* backend = nullptr;
  // For the start-up log: which device and why, e.g. "cuda:0 (NVIDIA H100 80GB HBM3), device 0
  // of 1 visible (--device auto)" or "cpu (--device auto: no CUDA device: ...)".
  std::string description;
  // On CUDA: the device index among the visible ones, and how many are visible (-1, 0 on CPU).
  int cuda_device = -1;
  int cuda_visible = 0;
};

OpenedDevice open_device(DeviceRequest request, int64_t local_rank);

}  // namespace dlaunch::kernels
