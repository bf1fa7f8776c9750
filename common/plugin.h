// Loading one of dlaunch's plugins: shared objects built beside the binaries for what the
// binaries must not link (the CUDA backend, the NCCL process group: non-Debian libraries a
// machine without a GPU does not have). Looked for at $<env_var> when it is set and not empty,
// else `file` beside the running executable, else in ../lib/dlaunch/ from it; the first that
// exists is loaded (RTLD_NOW | RTLD_LOCAL: the plugin keeps its own copy of our code).
// Blocks while the dynamic linker loads it and its libraries; never throws.
#pragma once

#include <string>
#include <vector>

namespace dlaunch {

struct LoadedPlugin {
  void* handle = nullptr;           // dlopen's handle; null when not loaded
  std::string path;                 // the file loaded (or that failed to load)
  std::vector<std::string> tried;   // the candidates that did not exist, in order
  std::string load_error;           // dlerror() when `path` exists but did not load
  // The named symbol, or null.
  void* symbol(const char* name) const;
};

LoadedPlugin load_plugin(const std::string& file, const char* env_var);

}  // namespace dlaunch
