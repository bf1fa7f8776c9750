// libdlaunch_cuda.so: the CUDA backend as a plugin dtrain loads at run time (kernels/cuda_plugin.h
// says why and what the functions promise). Exceptions never cross this C boundary.
#include <cstdio>
#include <exception>
#include <string>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda_plugin.h"

namespace {

void say(char* out, size_t len, const std::string& text) {
  if (out != nullptr && len > 0) std::snprintf(out, len, "%s", text.c_str());
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int dlaunch_cuda_plugin_abi() {
  return kCudaPluginAbi;
}

extern "C" __attribute__((visibility("default"))) int dlaunch_cuda_device_count(char* why,
                                                                               size_t len) {
  std::string reason;
  const int n = dlaunch::kernels::cuda::device_count(&reason);
  if (n == 0) say(why, len, reason);
  return n;
}

extern "C" __attribute__((visibility("default"))) dlaunch::kernels::Backend* dlaunch_cuda_open(
    int device, char* why, size_t len) {
  try {
    return &dlaunch::kernels::cuda::open_backend(device);
  } catch (const std::exception& e) {
    say(why, len, e.what());
    return nullptr;
  }
}
