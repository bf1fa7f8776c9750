// dlaunch::heartbeat(): tells the agent "this worker is making progress". Call it from the
// training loop (every step is fine: calls closer than kHeartbeatMinInterval are free). With
// --hang_timeout T, a worker whose heartbeat file was not touched for T seconds is declared hung,
// its stack is captured and the group restarts (docs/troubleshooting.md).
//
// The file is named by DLAUNCH_HEARTBEAT_FILE (common/worker_env.h); without it (not started by
// dlaunch) heartbeat() does nothing. Header-only so any worker can use it without linking.
// Thread-safe, never throws, never blocks beyond one utimensat(2) (or an open(2) the first time).
// The Python equivalent is in docs/env.md.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>

namespace dlaunch {

inline constexpr std::chrono::milliseconds kHeartbeatMinInterval{100};

inline void heartbeat() {
  static const char* const path = std::getenv("DLAUNCH_HEARTBEAT_FILE");
  static std::atomic<int64_t> last_ns{0};
  if (path == nullptr || *path == '\0') return;
  int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now().time_since_epoch())
                    .count();
  int64_t last = last_ns.load(std::memory_order_relaxed);
  if (last != 0 && now - last < std::chrono::nanoseconds(kHeartbeatMinInterval).count()) return;
  if (!last_ns.compare_exchange_strong(last, now, std::memory_order_relaxed)) return;
  // The agent reads the file's mtime; utimensat(NULL) sets it to now without writing data.
  if (::utimensat(AT_FDCWD, path, nullptr, 0) == 0) return;
  if (errno == ENOENT) {
    int fd = ::open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) ::close(fd);
  }
}

}  // namespace dlaunch
