#include "common/file_bytes.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace dlaunch {

std::optional<std::vector<uint8_t>> read_file_bytes(const std::string& path, int* err) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (err) *err = errno;
    return std::nullopt;
  }
  constexpr size_t kBlock = size_t{1} << 20;
  std::vector<uint8_t> bytes;
  struct stat st {};
  // One block more than the size: the read that finds the end needs room too.
  if (::fstat(fd, &st) == 0 && st.st_size > 0) bytes.reserve(static_cast<size_t>(st.st_size) + kBlock);
  while (true) {
    const size_t have = bytes.size();
    bytes.resize(have + kBlock);
    ssize_t n = ::read(fd, bytes.data() + have, kBlock);
    bytes.resize(have + static_cast<size_t>(n > 0 ? n : 0));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      if (err) *err = errno;
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
  }
  ::close(fd);
  return bytes;
}

}  // namespace dlaunch
