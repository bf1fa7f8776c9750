#pragma once
// The CUDA backend for GPU tests, or nullptr where none is usable (no plugin, driver or device),
// so the caller skips with its reason. Header-only: DLAUNCH_CUDA_PLUGIN_PATH is a definition of
// the including test target (the plugin built beside it), not of the support library.

#include <cstdlib>
#include <filesystem>

#include "kernels/backend.h"
#include "kernels/device.h"

namespace dlaunch::testing {

inline kernels::Backend* cuda_backend_or_null() {
#ifdef DLAUNCH_CUDA_PLUGIN_PATH
  // A test binary is not beside the plugin as dtrain is (in the build; a bundle carried
  // elsewhere sets DLAUNCH_CUDA_PLUGIN itself, which wins).
  if (std::filesystem::exists(DLAUNCH_CUDA_PLUGIN_PATH)) {
    ::setenv("DLAUNCH_CUDA_PLUGIN", DLAUNCH_CUDA_PLUGIN_PATH, 0);
  }
#endif
  kernels::Backend* be = kernels::open_device(kernels::DeviceRequest::kAuto, 0).backend;
  return be->host_accessible() ? nullptr : be;
}

}  // namespace dlaunch::testing
