#include "launcher/hang/heartbeat_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string_view>

namespace dlaunch {

bool arm_heartbeat_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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

bool announced_rank_recovery(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[kHeartbeatFileReadLimit];
  size_t got = 0;
  while (got < sizeof(buf)) {
    ssize_t n = ::read(fd, buf + got, sizeof(buf) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  constexpr std::string_view kLine = "rank_recovery";
  std::string_view text(buf, got);
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    // Only a whole line: one still being written (no newline yet) is not an announcement.
    if (end == std::string_view::npos) break;
    if (text.substr(start, end - start) == kLine) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace dlaunch
