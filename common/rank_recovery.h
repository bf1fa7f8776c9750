// dlaunch::announce_rank_recovery(): tells the agent "this worker can survive the death of a peer
// rank in process": when a peer dies, it waits for the agent's replacement of that rank and
// re-forms the group with it instead of exiting (docs/env.md, "Rank-level recovery"). The agent
// replaces a single failed rank only when that worker announced; otherwise it restarts the
// whole group.
//
// The announcement is the line "rank_recovery" in the heartbeat file (DLAUNCH_HEARTBEAT_FILE),
// written once after start, and only when the agent offers recovery (DLAUNCH_RECOVERY_KEY is set):
// the file is the one channel the agent already has to every worker, and only its mtime (the
// heartbeat) was read so far, so its content is free. Writing keeps the file's times as they
// were: the announcement is not a beat (a first beat starts the hang clock, and a replacement's
// first beat tells the agent it is up). Call it once the worker can survive a peer's death
// (dtrain: when it holds the training state). Header-only so any worker can use it without
// linking. Never throws; returns whether the line was written.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace dlaunch {

inline constexpr const char kRankRecoveryLine[] = "rank_recovery\n";

inline bool announce_rank_recovery() {
  const char* key = std::getenv("DLAUNCH_RECOVERY_KEY");
  const char* path = std::getenv("DLAUNCH_HEARTBEAT_FILE");
  if (key == nullptr || *key == '\0' || path == nullptr || *path == '\0') return false;
  // O_TRUNC: the file holds the announcement and nothing else, whatever an earlier worker of
  // this rank left (the agent makes the file anew per spawn; this keeps it exact if it does not).
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  struct stat before {};
  const bool had_times = ::fstat(fd, &before) == 0;
  const size_t n = std::strlen(kRankRecoveryLine);
  const bool written = ::write(fd, kRankRecoveryLine, n) == static_cast<ssize_t>(n);
  if (had_times) {
    const struct timespec times[2] = {before.st_atim, before.st_mtim};
    ::futimens(fd, times);
  }
  ::close(fd);
  return written;
}

// Takes the announcement back: the file is emptied, its times kept. A worker that exits on an
// error calls it on its way out, so that the agent restarts the whole group instead of
// replacing this rank alone: such an exit is not a crash that a fresh copy of the rank repairs
// (a survivor that could not re-form, a diverged loss, a refused checkpoint), and its peers are
// then in no state to welcome a replacement. Never throws.
inline void withdraw_rank_recovery() {
  const char* path = std::getenv("DLAUNCH_HEARTBEAT_FILE");
  if (path == nullptr || *path == '\0') return;
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat before {};
  const bool had_times = ::fstat(fd, &before) == 0;
  if (::ftruncate(fd, 0) == 0 && had_times) {
    const struct timespec times[2] = {before.st_atim, before.st_mtim};
    ::futimens(fd, times);
  }
  ::close(fd);
}

}  // namespace dlaunch
