// The CUDA backend object (kernels/backend.h) for a device. Built into the CUDA plugin and the
// CUDA tests; dtrain reaches it through kernels/device.h.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"

namespace dlaunch::kernels::cuda {

// Makes `device` current on the calling thread and returns its backend (one per device, living
// until the process ends). Throws InternalError naming the CUDA error when the device is unusable.
Backend& open_backend(int device);

}  // namespace dlaunch::kernels::cuda
