#include "launcher/process/orphan_guard.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "common/error.h"
#include "common/log.h"

namespace dlaunch {
namespace {

constexpr size_t kRecord = 1 + sizeof(int32_t);
constexpr size_t kMaxGroups = 65536;
constexpr size_t kMaxPaths = 4;
constexpr size_t kMaxPath = 4096;  // with its terminating NUL
constexpr int kMaxDepth = 16;      // directory levels removed (each takes a stack buffer)

// getdents64's record; glibc has no declaration for the raw call.
struct LinuxDirent64 {
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];
};

void remove_entry(int dirfd, const char* name, int depth);

// Deletes everything in the open directory `fd`. Entries are removed while the directory is
// read, so it is read again from the start until a pass finds nothing (bounded: an entry that
// cannot be removed must not keep the guard forever).
void clear_dir(int fd, int depth) {
  alignas(8) char buf[2048];
  for (int pass = 0; pass < 64; ++pass) {
    if (lseek(fd, 0, SEEK_SET) != 0) return;
    bool any = false;
    while (true) {
      long n = ::syscall(SYS_getdents64, fd, buf, sizeof(buf));
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        auto* d = reinterpret_cast<LinuxDirent64*>(buf + off);
        off += d->d_reclen;
        const char* nm = d->d_name;
        if (nm[0] == '.' && (nm[1] == '\0' || (nm[1] == '.' && nm[2] == '\0'))) continue;
        remove_entry(fd, nm, depth);
        any = true;
      }
    }
    if (!any) return;
  }
}

// Removes `name` (relative to `dirfd`): a file, or a directory with its contents. System calls
// only: the guard may not allocate.
void remove_entry(int dirfd, const char* name, int depth) {
  if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT) return;
  if (errno != EISDIR) return;
  if (depth > 0) {
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      clear_dir(fd, depth - 1);
      close(fd);
    }
  }
  unlinkat(dirfd, name, AT_REMOVEDIR);
}

// Runs in the forked guard: only async-signal-safe calls from here on (the agent may have had
// threads). Group ids live in a fixed array: no allocation.
[[noreturn]] void guard_main(int fd) {
  static pid_t groups[kMaxGroups];
  static char paths[kMaxPaths][kMaxPath];
  size_t n = 0, n_paths = 0;
  // Terminal signals go to the agent's process group; the guard must outlive them long enough
  // to act if the agent then dies without cleaning up.
  setpgid(0, 0);
  signal(SIGINT, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  signal(SIGUSR1, SIG_IGN);
  signal(SIGUSR2, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  // Room for a path record (kRecord + kMaxPath) and then some.
  static char buf[2 * kMaxPath + kRecord * 256];
  size_t have = 0;
  while (true) {
    ssize_t r = read(fd, buf + have, sizeof(buf) - have);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;  // the agent is gone
    have += static_cast<size_t>(r);
    size_t off = 0;
    for (; off + kRecord <= have; off += kRecord) {
      int32_t pg;
      std::memcpy(&pg, buf + off + 1, sizeof(pg));
      char op = buf[off];
      if (op == 'q') _exit(0);
      if (op == 'p') {
        // A path record: its length, then its bytes (remove_on_death keeps it below kMaxPath).
        size_t len = static_cast<size_t>(pg);
        if (off + kRecord + len > have) break;  // the rest is still in the pipe
        if (n_paths < kMaxPaths && len < kMaxPath) {
          std::memcpy(paths[n_paths], buf + off + kRecord, len);
          paths[n_paths][len] = '\0';
          ++n_paths;
        }
        off += len;
      } else if (op == '+' && n < kMaxGroups) {
        groups[n++] = pg;
      } else if (op == '-') {
        for (size_t i = 0; i < n; ++i) {
          if (groups[i] == pg) {
            groups[i] = groups[--n];
            break;
          }
        }
      }
    }
    std::memmove(buf, buf + off, have - off);
    have -= off;
  }
  for (size_t i = 0; i < n; ++i) kill(-groups[i], SIGKILL);
  // Lazily: a dying worker may still hold a file open there; the memory goes when it is gone.
  for (size_t i = 0; i < n_paths; ++i) {
    umount2(paths[i], MNT_DETACH);
    remove_entry(AT_FDCWD, paths[i], kMaxDepth);
  }
  _exit(0);
}

}  // namespace

OrphanGuard::OrphanGuard() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw SystemError(errno_message("pipe2 for the orphan guard", errno));
  // A "clone child": a fork (no shared memory) whose exit signals nothing to the agent. waitid()
  // without __WALL does not see such a child, so the agent can ask the kernel "do I have any
  // child left?" (ECHILD) and skip scanning /proc at teardown (posix_process_context.cc), and
  // the agent gets no SIGCHLD for the guard. A raw clone, not glibc's fork(): the child skips
  // glibc's fork housekeeping (atfork handlers, the thread's cached tid), which is fine for
  // guard_main, which uses only plain system calls. Reparented after the agent dies, it gets
  // SIGCHLD as its exit signal again, so whoever inherits it reaps it normally.
  pid_ = static_cast<pid_t>(::syscall(SYS_clone, 0, nullptr, nullptr, nullptr, nullptr));
  if (pid_ < 0) {
    int err = errno;
    close(fds[0]);
    close(fds[1]);
    throw SystemError(errno_message("fork of the orphan guard", err));
  }
  if (pid_ == 0) {
    // Keep only the read end (as fd 3); stdio goes to /dev/null so the guard never holds the
    // agent's output pipes open.
    dup2(fds[0], 3);
    close_range(4, ~0U, 0);
    int null_fd = open("/dev/null", O_RDWR);
    if (null_fd >= 0) {
      dup2(null_fd, 0);
      dup2(null_fd, 1);
      dup2(null_fd, 2);
      if (null_fd > 3) close(null_fd);
    }
    guard_main(3);
  }
  close(fds[0]);
  fd_ = fds[1];
}

OrphanGuard::~OrphanGuard() { stop(); }

void OrphanGuard::send(char op, pid_t pgid) {
  if (fd_ < 0) return;
  char rec[kRecord];
  rec[0] = op;
  int32_t pg = static_cast<int32_t>(pgid);
  std::memcpy(rec + 1, &pg, sizeof(pg));
  // Records are smaller than PIPE_BUF, so each write is atomic; the guard reads promptly.
  while (write(fd_, rec, sizeof(rec)) < 0 && errno == EINTR) {
  }
}

void OrphanGuard::add_group(pid_t pgid) { send('+', pgid); }

bool OrphanGuard::remove_on_death(const std::string& path) {
  if (fd_ < 0 || path.empty() || path.size() >= kMaxPath) return false;
  std::string rec(kRecord, '\0');
  rec[0] = 'p';
  int32_t len = static_cast<int32_t>(path.size());
  std::memcpy(&rec[1], &len, sizeof(len));
  rec += path;
  // Larger than PIPE_BUF is possible, so write in a loop; only the loop thread writes here.
  size_t done = 0;
  while (done < rec.size()) {
    ssize_t w = write(fd_, rec.data() + done, rec.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}
void OrphanGuard::remove_group(pid_t pgid) { send('-', pgid); }

void OrphanGuard::stop() {
  if (fd_ < 0) return;
  send('q', 0);
  close(fd_);
  fd_ = -1;
  // The guard exits at once on 'q' (or the end of the pipe). One that cannot (stopped by a
  // stray SIGSTOP, as a chaos soak found) must not hold the agent's exit forever: it gets a
  // second, then SIGKILL, which also ends a stopped process.
  int exited = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  if (exited >= 0) {
    pollfd p{exited, POLLIN, 0};
    int ready;
    while ((ready = poll(&p, 1, 1000)) < 0 && errno == EINTR) {
    }
    if (ready == 0) {
      log_warning("the orphan guard (pid {}) did not exit when told; killing it", pid_);
      kill(pid_, SIGKILL);
    }
    close(exited);
  }
  // __WCLONE: the guard is a clone child (see the constructor).
  while (waitpid(pid_, nullptr, __WCLONE) < 0 && errno == EINTR) {
  }
}

}  // namespace dlaunch
