#include "launcher/flash/flash_persist.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "common/log.h"

namespace dlaunch {
namespace fs = std::filesystem;

namespace {

// `from` into `to` through `to`.tmp.<pid>: fsync of the file, rename, fsync of the directory.
bool copy_durably(const fs::path& from, const fs::path& to, std::string& why) {
  const fs::path tmp = to.string() + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::copy_file(from, tmp, fs::copy_options::overwrite_existing, ec);
  if (ec) {
    why = ec.message();
    return false;
  }
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CLOEXEC);
  bool synced = fd >= 0 && ::fsync(fd) == 0;
  int err = errno;
  if (fd >= 0) ::close(fd);
  if (!synced) {
    why = std::strerror(err);
    fs::remove(tmp, ec);
    return false;
  }
  fs::rename(tmp, to, ec);
  if (ec) {
    why = ec.message();
    fs::remove(tmp, ec);
    return false;
  }
  int dir = ::open(to.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return true;
}

bool skipped(const std::string& name) {
  return name.empty() || name[0] == '.' || name.rfind("data_", 0) == 0;
}

}  // namespace

std::vector<std::string> persist_flash_state(const std::string& flash_dir) {
  std::vector<std::string> written;
  std::error_code ec;
  if (flash_dir.empty() || !fs::is_directory(flash_dir, ec)) return written;
  for (const auto& sub : fs::directory_iterator(flash_dir, ec)) {
    const fs::path request = sub.path() / kPersistRequestFile;
    if (!sub.is_directory(ec) || !fs::is_regular_file(request, ec)) continue;
    std::ifstream in(request);
    std::string target;
    std::getline(in, target);
    if (target.empty() || !fs::path(target).is_absolute()) {
      log_warning("{} names no absolute directory ('{}'); its flash state is not kept",
                  request.string(), target);
      continue;
    }
    for (const auto& file : fs::directory_iterator(sub.path(), ec)) {
      const std::string name = file.path().filename().string();
      if (skipped(name) || !file.is_regular_file(ec)) continue;
      const fs::path to = fs::path(target) / name;
      if (fs::exists(to, ec)) continue;  // that state is on disk already
      fs::create_directories(target, ec);
      std::string why;
      if (copy_durably(file.path(), to, why)) {
        written.push_back(to.string());
      } else {
        log_warning("cannot keep the flash copy {} in {}: {}; it is lost with the flash "
                    "directory",
                    file.path().string(), target, why);
      }
    }
  }
  return written;
}

}  // namespace dlaunch
