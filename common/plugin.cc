#include "common/plugin.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>

namespace dlaunch {
namespace fs = std::filesystem;

void* LoadedPlugin::symbol(const char* name) const {
  return handle == nullptr ? nullptr : ::dlsym(handle, name);
}

LoadedPlugin load_plugin(const std::string& file, const char* env_var) {
  std::vector<std::string> candidates;
  if (const char* path = std::getenv(env_var); path != nullptr && *path != '\0') {
    candidates = {path};
  } else {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (ec) {
      candidates = {file};  // the dynamic linker's search path
    } else {
      const fs::path dir = exe.parent_path();
      candidates = {(dir / file).string(), (dir / ".." / "lib" / "dlaunch" / file).string()};
    }
  }
  LoadedPlugin p;
  for (const std::string& path : candidates) {
    std::error_code ec;
    if (path.find('/') != std::string::npos && !fs::exists(path, ec)) {
      p.tried.push_back(path);
      continue;
    }
    p.path = path;
    p.handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (p.handle == nullptr) {
      const char* e = ::dlerror();
      p.load_error = e != nullptr ? e : "unknown error";
    }
    return p;
  }
  return p;
}

}  // namespace dlaunch
