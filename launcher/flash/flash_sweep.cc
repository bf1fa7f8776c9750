#include "launcher/flash/flash_sweep.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <system_error>

#include "common/log.h"

namespace dlaunch {
namespace fs = std::filesystem;
namespace {

constexpr const char kPrefix[] = "dlaunch_flash_";
constexpr const char kRecordHeader[] = "dlaunch flash owner 1";

// A process as the kernel knows it now: its state letter and start time (clock ticks after
// boot, field 22 of /proc/<pid>/stat). nullopt when there is no such process. Plain open/read:
// a process reaped between the open and the read fails the read with ESRCH, which libstdc++'s
// streams would throw on.
struct ProcIdentity {
  char state = 0;
  unsigned long long start_ticks = 0;
};

std::optional<ProcIdentity> proc_identity(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  char path[32];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[1024];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof(buf) - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  buf[n] = '\0';
  // The command name may hold spaces and ')': the fields that follow start after the last ')'.
  const char* close = std::strrchr(buf, ')');
  if (close == nullptr) return std::nullopt;
  std::istringstream fields(close + 1);
  ProcIdentity id;
  std::string skip;
  fields >> id.state;
  for (int field = 4; field < 22 && fields; ++field) fields >> skip;  // ppid .. priority, nice..
  if (!(fields >> id.start_ticks)) return std::nullopt;
  return id;
}

std::string pid_namespace() {
  std::error_code ec;
  fs::path ns = fs::read_symlink("/proc/self/ns/pid", ec);
  return ec ? std::string() : ns.string();
}

struct OwnerRecord {
  std::string pid_ns, run_id;
  pid_t agent = 0, guard = 0;
  unsigned long long agent_start = 0, guard_start = 0;
};

std::optional<OwnerRecord> read_owner(const fs::path& dir) {
  std::ifstream in(dir / kFlashOwnerFile);
  std::string header;
  if (!std::getline(in, header) || header != kRecordHeader) return std::nullopt;
  OwnerRecord r;
  std::string key;
  int seen = 0;
  while (in >> key) {
    if (key == "pidns") seen |= (in >> r.pid_ns) ? 1 : 0;
    else if (key == "agent") seen |= (in >> r.agent >> r.agent_start) ? 2 : 0;
    else if (key == "guard") seen |= (in >> r.guard >> r.guard_start) ? 4 : 0;
    else if (key == "run") seen |= (in >> r.run_id) ? 8 : 0;
    else return std::nullopt;
  }
  if (seen != 15) return std::nullopt;
  return r;
}

// The recorded process is still running: same pid, same start time, not a zombie.
bool still_running(pid_t pid, unsigned long long start_ticks) {
  auto id = proc_identity(pid);
  return id && id->start_ticks == start_ticks && id->state != 'Z' && id->state != 'X';
}

}  // namespace

bool write_flash_owner(const std::string& dir, pid_t agent_pid, pid_t guard_pid,
                       const std::string& run_id) {
  auto agent = proc_identity(agent_pid);
  auto guard = proc_identity(guard_pid);
  std::string ns = pid_namespace();
  if (!agent || !guard || ns.empty()) {
    log_warning("cannot describe the owner of the flash directory {} (agent pid {}, orphan guard "
                "pid {}): a later dlaunch will not remove it if this one and its guard are killed "
                "together",
                dir, agent_pid, guard_pid);
    return false;
  }
  // The run id goes in as one token: the record is read back word by word.
  std::string run = run_id;
  for (char& c : run) {
    if (c == ' ' || c == '\n' || c == '\t') c = '_';
  }
  std::string text = fmt::format("{}\npidns {}\nagent {} {}\nguard {} {}\nrun {}\n", kRecordHeader,
                                 ns, agent_pid, agent->start_ticks, guard_pid, guard->start_ticks,
                                 run.empty() ? "-" : run);
  // Written whole under a temporary name and renamed: a sweeper never reads half a record.
  fs::path tmp = fs::path(dir) / (std::string(kFlashOwnerFile) + ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.flush()) {
      log_warning("cannot write the owner record of the flash directory {}: a later dlaunch will "
                  "not remove it if this one and its guard are killed together",
                  dir);
      return false;
    }
  }
  std::error_code ec;
  fs::rename(tmp, fs::path(dir) / kFlashOwnerFile, ec);
  if (ec) {
    log_warning("cannot write the owner record of the flash directory {}: {}", dir, ec.message());
    return false;
  }
  return true;
}

std::vector<std::string> sweep_stale_flash_dirs(const std::string& base) {
  std::vector<std::string> removed;
  struct stat base_st {};
  if (::stat(base.c_str(), &base_st) != 0) return removed;
  const std::string our_ns = pid_namespace();
  std::error_code ec;
  fs::directory_iterator it(base, ec);
  if (ec) return removed;
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    const std::string path = entry.path().string();
    struct stat st {};
    // lstat: a link named like a flash directory is not followed, let alone emptied.
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
      continue;
    }
    auto owner = read_owner(entry.path());
    if (!owner) {
      log_debug("flash directory {}: no owner record (an older dlaunch, or one being made now); "
                "left alone",
                path);
      continue;
    }
    if (owner->pid_ns != our_ns) {
      log_debug("flash directory {}: made in pid namespace {}, not ours; left alone", path,
                owner->pid_ns);
      continue;
    }
    if (still_running(owner->agent, owner->agent_start) ||
        still_running(owner->guard, owner->guard_start)) {
      continue;  // a live job's
    }
    // A tmpfs of its own is a mount point: another device than the base it sits in.
    const bool mounted = st.st_dev != base_st.st_dev;
    std::string unmount_note;
    if (mounted) {
      if (::umount2(path.c_str(), MNT_DETACH) == 0) {
        unmount_note = ", its tmpfs unmounted";
      } else {
        unmount_note = fmt::format(", but its tmpfs could not be unmounted ({}: run `umount -l {}` "
                                   "as root to free it)",
                                   std::strerror(errno), path);
      }
    }
    std::error_code rm;
    fs::remove_all(path, rm);
    if (rm && fs::exists(path)) {
      log_warning("stale flash directory {} of run {} (agent pid {} and orphan guard pid {} are "
                  "gone){}: cannot remove it: {}",
                  path, owner->run_id, owner->agent, owner->guard, unmount_note, rm.message());
      continue;
    }
    log_info("removed the stale flash directory {} of run {}: its agent (pid {}) and orphan guard "
             "(pid {}) died without removing it{}",
             path, owner->run_id, owner->agent, owner->guard, unmount_note);
    removed.push_back(path);
  }
  return removed;
}

}  // namespace dlaunch
