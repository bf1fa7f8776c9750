// The C interface between dtrain and its CUDA backend plugin, libdlaunch_cuda.so
// (kernels/cuda/plugin.cc). The plugin carries everything that needs the CUDA libraries (the
// CUDA ops, cuDNN, cuBLAS, the runtime), so dtrain itself links none of them: it starts on a
// machine without a driver or a toolkit and loads the plugin only when a GPU is asked for
// (kernels/device.h). Both sides are built from one tree; kCudaPluginAbi changes whenever
// kernels::Backend or these functions change, and the loader refuses another value.
#pragma once

#include <cstddef>

namespace dlaunch::kernels {
class Backend;
}

extern "C" {
// Bump with any change to kernels::Backend (its op table included) or to the functions below.
// 2: the batch norm ops take the count in the backend's memory (SyncBN on the device).
constexpr int kCudaPluginAbi = 2;
using DlaunchCudaAbiFn = int (*)();
// Devices the CUDA runtime can use (0 on any error); when 0, `why` receives the reason
// (NUL-terminated, at most len bytes).
using DlaunchCudaDeviceCountFn = int (*)(char* why, size_t len);
// The backend of device `device` (made current on the calling thread), owned by the plugin and
// valid until the process ends; nullptr with the reason in `why` on failure.
using DlaunchCudaOpenFn = dlaunch::kernels::Backend* (*)(int device, char* why, size_t len);
}
