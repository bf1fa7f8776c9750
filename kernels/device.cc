#include "kernels/device.h"

#include <fmt/format.h>

#include <unistd.h>

#include <cstdlib>

#include "common/error.h"
#include "common/plugin.h"
#include "kernels/cuda_plugin.h"

namespace dlaunch::kernels {

namespace {

// The CUDA side as seen from here: the plugin's functions when it loaded, else why not.
struct CudaPlugin {
  std::string path;  // the file loaded
  DlaunchCudaDeviceCountFn device_count = nullptr;
  DlaunchCudaOpenFn open = nullptr;
  std::string error;  // non-empty: not usable, said as "found ..."
};

const CudaPlugin& cuda_plugin() {
  static const CudaPlugin plugin = [] {
    CudaPlugin p;
    const LoadedPlugin loaded = load_plugin("libdlaunch_cuda.so", "DLAUNCH_CUDA_PLUGIN");
    p.path = loaded.path;
    if (loaded.path.empty()) {
      std::string list;
      for (const auto& t : loaded.tried) list += (list.empty() ? "" : ", ") + t;
      p.error = fmt::format("found no CUDA backend plugin at {} (a dtrain built without CUDA?)", list);
      return p;
    }
    if (loaded.handle == nullptr) {
      p.error = fmt::format("found the CUDA backend {}, which did not load: {}", loaded.path,
                            loaded.load_error);
      return p;
    }
    auto abi = reinterpret_cast<DlaunchCudaAbiFn>(loaded.symbol("dlaunch_cuda_plugin_abi"));
    p.device_count =
        reinterpret_cast<DlaunchCudaDeviceCountFn>(loaded.symbol("dlaunch_cuda_device_count"));
    p.open = reinterpret_cast<DlaunchCudaOpenFn>(loaded.symbol("dlaunch_cuda_open"));
    if (abi == nullptr || p.device_count == nullptr || p.open == nullptr) {
      p.error = fmt::format("found {}, which is not a dlaunch CUDA backend (its functions are "
                            "missing)",
                            loaded.path);
    } else if (abi() != kCudaPluginAbi) {
      p.error = fmt::format("found {}, built for plugin interface {} where this dtrain needs {} "
                            "(install the plugin of the same build)",
                            loaded.path, abi(), kCudaPluginAbi);
    }
    return p;
  }();
  return plugin;
}

// The NVIDIA driver's device nodes (Linux; /dev/dxg: WSL). Without any of them the CUDA runtime
// can only answer "no device", and loading it to hear that costs 0.2-0.3 s of every worker's
// start on a loaded host, which a restarted worker pays again, and a restart should take well
// under a second.
// An explicit DLAUNCH_CUDA_PLUGIN still loads the plugin whatever is here.
bool no_gpu_driver_here() {
  const char* explicit_plugin = std::getenv("DLAUNCH_CUDA_PLUGIN");
  if (explicit_plugin != nullptr && *explicit_plugin != '\0') return false;
  for (const char* node : {"/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg"}) {
    if (::access(node, F_OK) == 0) return false;
  }
  return true;
}

std::string visible_devices_text() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v == nullptr ? std::string("CUDA_VISIBLE_DEVICES unset")
                      : fmt::format("CUDA_VISIBLE_DEVICES='{}'", v);
}

}  // namespace

DeviceRequest parse_device_request(const std::string& text) {
  if (text == "auto") return DeviceRequest::kAuto;
  if (text == "cpu") return DeviceRequest::kCpu;
  if (text == "cuda") return DeviceRequest::kCuda;
  throw UsageError(fmt::format("--device must be auto, cpu or cuda, got '{}'", text));
}

OpenedDevice open_device(DeviceRequest request, int64_t local_rank) {
  if (request == DeviceRequest::kCpu) return {&cpu_backend(), "cpu (--device cpu)", -1, 0};
  const char* flag = request == DeviceRequest::kAuto ? "--device auto" : "--device cuda";
  std::string none;  // why there is no usable GPU
  int count = 0;
  const CudaPlugin* plugin = nullptr;
  if (no_gpu_driver_here()) {
    none = "found no NVIDIA driver (no /dev/nvidiactl, /dev/nvidia0 or /dev/dxg)";
  } else if (plugin = &cuda_plugin(); !plugin->error.empty()) {
    none = plugin->error;
  } else {
    char why[512] = {};
    count = plugin->device_count(why, sizeof why);
    if (count <= 0) {
      none = fmt::format("found no device through the CUDA runtime ({}, {}): {}", plugin->path,
                         visible_devices_text(), why);
    }
  }
  if (none.empty()) {
    const int device = static_cast<int>(local_rank % count);
    char why[512] = {};
    Backend* backend = plugin->open(device, why, sizeof why);
    if (backend != nullptr) {
      std::string shared =
          local_rank >= count
              ? fmt::format("; LOCAL_RANK {} shares it (more local workers than devices)", local_rank)
              : std::string();
      return {backend,
              fmt::format("{}, device {} of {} visible ({}){}", backend->name(), device, count,
                          flag, shared),
              device, count};
    }
    none = fmt::format("found device {} of {} visible ({}) but could not open it: {}", device,
                       count, visible_devices_text(), why);
  }
  if (request == DeviceRequest::kAuto) {
    return {&cpu_backend(), fmt::format("cpu (--device auto: looked for a CUDA GPU and {})", none),
            -1, 0};
  }
  throw UsageError(fmt::format(
      "--device cuda needs a usable NVIDIA GPU: looked for one and {}; run with --device cpu, or "
      "--device auto to fall back to the CPU",
      none));
}

}  // namespace dlaunch::kernels
