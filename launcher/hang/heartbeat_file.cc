#include "launcher/hang/heartbeat_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

namespace dlaunch {

bool arm_heartbeat_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const struct timespec times[2] = {{kUnarmedHeartbeatSeconds, 0}, {kUnarmedHeartbeatSeconds, 0}};
  bool ok = ::futimens(fd, times) == 0;
  int err = errno;
  ::close(fd);
  errno = err;
  return ok;
}

std::optional<TimePoint> last_heartbeat(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  if (st.st_mtim.tv_sec == kUnarmedHeartbeatSeconds && st.st_mtim.tv_nsec == 0) return std::nullopt;
  auto mtime = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
  auto age = std::chrono::system_clock::now() - mtime;
  return std::chrono::steady_clock::now() -
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(age);
}

}  // namespace dlaunch
