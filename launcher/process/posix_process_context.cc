#include "launcher/process/posix_process_context.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "common/error.h"
#include "common/log.h"

namespace dlaunch {
namespace asio = boost::asio;

namespace {

// One read(2) at most this much; a readiness wakeup reads at most kReadBudget before it lets the
// loop serve other workers' pipes (the rest is read at the next turn).
constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kReadBudget = 256 * 1024;

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Parses /proc/<pid>/stat: the state letter and the parent pid. The command name may contain
// spaces and parentheses, so fields are read after the last ')'. Plain open/read, not iostreams:
// a process reaped between the open and the read makes read() fail with ESRCH, and libstdc++'s
// filebuf throws on that whatever the stream's exception mask; here it is just "gone".
bool read_stat(int pid, char* state, int* ppid) {
  char path[32];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[512];  // pid, comm (at most 64 bytes in parentheses), state, ppid come first
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof(buf) - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* close = std::strrchr(buf, ')');
  char st = 0;
  int pp = 0;
  if (close == nullptr || std::sscanf(close + 1, " %c %d", &st, &pp) != 2) return false;
  if (state) *state = st;
  if (ppid) *ppid = pp;
  return true;
}

// A pidfd for `pid` if it still has the parent a /proc scan saw (or the agent, its parent having
// died since), else -1: a pid freed and reused after the scan is never signalled.
int pin_descendant(int pid, int parent) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return -1;  // gone already
  int ppid = 0;
  if (!read_stat(pid, nullptr, &ppid) || (ppid != parent && ppid != getpid())) {
    ::close(fd);
    return -1;
  }
  return fd;
}

ExitStatus status_from_siginfo(const siginfo_t& info) {
  switch (info.si_code) {
    case CLD_EXITED: return ExitStatus::exited(info.si_status);
    case CLD_DUMPED: return ExitStatus{true, info.si_status, true};
    default: return ExitStatus::killed(info.si_status);
  }
}

}  // namespace

struct PosixProcessContext::Child {
  explicit Child(asio::io_context& io) : pidfd(io), out(io), err(io) {}
  ~Child() { close_fd(exec_fd); }
  int pid = -1;
  std::string path;
  int exec_fd = -1;  // read end of the exec-status pipe: errno bytes if exec failed, else EOF
  asio::posix::stream_descriptor pidfd;
  asio::posix::stream_descriptor out;  // non-blocking read ends of the output pipes
  asio::posix::stream_descriptor err;
  ProcessCallbacks callbacks;

  asio::posix::stream_descriptor& pipe(int stream) { return stream == 1 ? out : err; }

  // Reads what the pipe holds now, up to `budget` bytes, and hands each chunk on at once. Bytes
  // move only here, synchronously on the loop thread, never through a buffer an asynchronous
  // read still owns: so the drain at exit and the readiness handler can never reorder,
  // duplicate or lose a chunk. Returns false once the pipe is at EOF (closed then): the process
  // and every child it left have closed their end.
  bool read_now(int stream, size_t budget, char* buf) {
    auto& d = pipe(stream);
    if (!d.is_open()) return false;
    while (budget > 0) {
      ssize_t r = ::read(d.native_handle(), buf, std::min(kReadChunk, budget));
      if (r > 0) {
        budget -= static_cast<size_t>(r);
        if (callbacks.on_output) {
          callbacks.on_output(stream, std::string_view(buf, static_cast<size_t>(r)));
        }
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      boost::system::error_code ignored;  // EOF, or an error no retry mends
      d.close(ignored);
      return false;
    }
    return true;
  }
};

std::string resolve_program(const std::string& name, const std::string& path) {
  if (name.find('/') != std::string::npos) return name;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + name;
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    start = end + 1;
  }
  return "";
}

std::vector<std::pair<int, int>> process_parents() {
  std::vector<std::pair<int, int>> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    int ppid = 0;
    if (read_stat(static_cast<int>(pid), nullptr, &ppid)) out.emplace_back(static_cast<int>(pid), ppid);
  }
  closedir(d);
  return out;
}

std::vector<int> child_pids(int parent) {
  std::vector<int> pids;
  for (const auto& [pid, ppid] : process_parents()) {
    if (ppid == parent) pids.push_back(pid);
  }
  return pids;
}

PosixProcessContext::PosixProcessContext(asio::io_context& io)
    : io_(io), read_buf_(new char[kReadChunk]) {
  // Orphaned grandchildren are reparented to us instead of init, so shutdown can find them.
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    throw SystemError(errno_message("prctl(PR_SET_CHILD_SUBREAPER)", errno));
  }
  // Writing to a closed console pipe or a dead guard must be an error, not our death.
  ::signal(SIGPIPE, SIG_IGN);
}

PosixProcessContext::~PosixProcessContext() {
  // Normally every child was reaped; if the agent unwinds early, none may outlive it.
  for (const auto& [pid, child] : children_) ::killpg(pid, SIGKILL);
  forget_leftovers();
}

namespace {

// argv and envp for execve, built before the clone: after it the child makes only
// async-signal-safe calls. Not copyable: the pointers point into the strings.
class ExecImage {
 public:
  ExecImage(const SpawnRequest& request, std::string program_path)
      : path(std::move(program_path)), argv_strings_(request.argv) {
    env_strings_.reserve(request.env.size());
    for (const auto& [k, v] : request.env) env_strings_.push_back(k + "=" + v);
    for (auto& s : env_strings_) envp_.push_back(s.data());
    envp_.push_back(nullptr);
    for (auto& s : argv_strings_) argv_.push_back(s.data());
    argv_.push_back(nullptr);
  }
  ExecImage(const ExecImage&) = delete;
  ExecImage& operator=(const ExecImage&) = delete;

  const std::string path;
  char* const* argv() const { return argv_.data(); }
  char* const* envp() const { return envp_.data(); }

 private:
  std::vector<std::string> argv_strings_;
  std::vector<std::string> env_strings_;
  std::vector<char*> argv_;
  std::vector<char*> envp_;
};

// A worker's pipes: stdout and stderr (when captured) and the exec-status pipe, whose write end
// closes on a successful exec and carries errno otherwise. Whatever is still held is closed when
// this goes, on the error paths too.
struct SpawnPipes {
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  int exec[2] = {-1, -1};

  explicit SpawnPipes(bool capture_output) {
    if (pipe2(exec, O_CLOEXEC) != 0 ||
        (capture_output && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0))) {
      int error = errno;
      close_all();
      throw SystemError(errno_message("pipe2 for a worker", error));
    }
  }
  ~SpawnPipes() { close_all(); }
  SpawnPipes(const SpawnPipes&) = delete;
  SpawnPipes& operator=(const SpawnPipes&) = delete;

  void close_all() {
    for (int* p : {out, err, exec}) {
      close_fd(p[0]);
      close_fd(p[1]);
    }
  }
};

// The child between clone and exec: only async-signal-safe calls.
[[noreturn]] void exec_child(const ExecImage& image, const SpawnPipes& pipes, pid_t parent,
                             bool capture_output) {
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction sa;
    if (sigaction(s, nullptr, &sa) != 0) continue;
    bool handled = (sa.sa_flags & SA_SIGINFO) ? sa.sa_sigaction != nullptr
                                              : (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN);
    if (handled || s == SIGPIPE) ::signal(s, SIG_DFL);
  }
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int err = 0;
  if (getppid() != parent) _exit(127);  // the agent died before the prctl took effect
  // Under Yama ptrace_scope 1, let the agent's own helpers (eu-stack/gdb for hung workers)
  // attach. Fails harmlessly (EINVAL) without Yama.
  prctl(PR_SET_PTRACER, parent, 0, 0, 0);
  if (capture_output) {
    if (dup2(pipes.out[1], 1) < 0 || dup2(pipes.err[1], 2) < 0) {
      err = errno;
      (void)!write(pipes.exec[1], &err, sizeof(err));
      _exit(127);
    }
  }
  // Only 0, 1, 2 survive exec; the exec pipe's write end closes on success, telling the agent.
  close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(image.path.c_str(), image.argv(), image.envp());
  err = errno;
  (void)!write(pipes.exec[1], &err, sizeof(err));
  _exit(127);
}

struct ChildArgs {
  const ExecImage* image;
  const SpawnPipes* pipes;
  pid_t parent;
  bool capture_output;
};

int child_main(void* arg) {
  const auto* a = static_cast<const ChildArgs*>(arg);
  exec_child(*a->image, *a->pipes, a->parent, a->capture_output);
}

// The child is a vfork-style clone, as glibc's posix_spawn makes (which cannot set
// PR_SET_PDEATHSIG, so it is not used): it shares the agent's memory (CLONE_VM) on a stack of its
// own, and this thread waits until it has exec'd or exited (CLONE_VFORK). No page tables are
// copied and no copy-on-write faults follow in the agent, which were most of a spawn's cost with
// the agent's threads and mappings (fork() was 6.5% of 1,024 agents' CPU after their round, the
// faults after it another few percent). The child changes nothing the agent sees: its signal
// dispositions, descriptor table and signal mask are its own (no CLONE_SIGHAND, CLONE_FILES),
// and exec_child makes only async-signal-safe calls. Every signal is blocked across the clone so
// no agent handler runs in the child (asio's would write to the agent's signal pipe); the child
// resets the dispositions and unblocks before exec.
pid_t spawn_child(const ExecImage& image, const SpawnPipes& pipes, bool capture_output) {
  constexpr size_t kStackBytes = 64 * 1024;  // exec_child's frames; the guard page below
  void* stack = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK,
                     -1, 0);
  if (stack == MAP_FAILED) throw SystemError(errno_message("mmap of a spawn stack", errno));
  mprotect(stack, 4096, PROT_NONE);  // an overflow faults instead of writing into the agent
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  ChildArgs args{&image, &pipes, getpid(), capture_output};
  pid_t pid = clone(child_main, static_cast<char*>(stack) + kStackBytes, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
  int clone_err = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  munmap(stack, kStackBytes);  // the child has exec'd or exited: it no longer runs on it
  if (pid < 0) throw SystemError(errno_message("clone of a worker", clone_err));
  return pid;
}

}  // namespace

int PosixProcessContext::spawn(const SpawnRequest& request, ProcessCallbacks callbacks) {
  DL_CHECK(!request.argv.empty()) << "spawn with an empty argv";
  std::string path_env = "/usr/local/bin:/usr/bin:/bin";
  for (const auto& [k, v] : request.env) {
    if (k == "PATH") path_env = v;
  }
  const std::string& name = request.argv[0];
  std::string path = resolve_program(name, path_env);
  if (path.empty()) {
    throw SpawnError(fmt::format(
        "program '{}' was not found in PATH ({}); give its full path or fix PATH", name,
        path_env));
  }
  const ExecImage image(request, path);
  SpawnPipes pipes(request.capture_output);
  pid_t pid = spawn_child(image, pipes, request.capture_output);
  // Both sides set the group so it exists before either relies on it (EACCES after exec is fine).
  setpgid(pid, pid);
  close_fd(pipes.out[1]);
  close_fd(pipes.err[1]);
  close_fd(pipes.exec[1]);
  // Do not wait for the exec to succeed here (the clone returned when execve replaced the child's
  // memory; the new program still has to load): the next worker is spawned at once. A failed
  // exec leaves its errno in the pipe; on_pidfd_ready reads it at the exit.
  fcntl(pipes.exec[0], F_SETFL, O_NONBLOCK);

  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    int err = errno;
    ::kill(pid, SIGKILL);
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    throw SystemError(errno_message("pidfd_open", err));
  }
  guard_.add_group(pid);

  auto child = std::make_shared<Child>(io_);
  child->pid = pid;
  child->path = path;
  child->exec_fd = std::exchange(pipes.exec[0], -1);
  child->callbacks = std::move(callbacks);
  child->pidfd.assign(pidfd);
  if (request.capture_output) {
    child->out.assign(std::exchange(pipes.out[0], -1));
    child->err.assign(std::exchange(pipes.err[0], -1));
    child->out.non_blocking(true);
    child->err.non_blocking(true);
    start_read(child, 1);
    start_read(child, 2);
  }
  children_[pid] = child;
  child->pidfd.async_wait(asio::posix::stream_descriptor::wait_read,
                          [this, pid](const boost::system::error_code& ec) {
                            if (!ec) on_pidfd_ready(pid);
                          });
  return pid;
}

void PosixProcessContext::start_read(const std::shared_ptr<Child>& child, int stream) {
  // Readiness, not async_read_some: the data stays in the pipe until read_now takes it.
  child->pipe(stream).async_wait(
      asio::posix::stream_descriptor::wait_read,
      [this, child, stream](const boost::system::error_code& ec) {
        if (ec) return;  // closed: EOF was read (perhaps by the drain at exit)
        if (child->read_now(stream, kReadBudget, read_buf_.get())) start_read(child, stream);
      });
}

void PosixProcessContext::on_pidfd_ready(int pid) {
  auto it = children_.find(pid);
  if (it == children_.end()) return;
  std::shared_ptr<Child> child = it->second;
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  int rc;
  // WNOHANG: the pidfd is a blocking descriptor (Asio's assign/async_wait do not make it
  // non-blocking), so without it a readiness that is not an exit would block the whole loop
  // inside waitid. Not exited yet shows as success with si_pid 0.
  do {
    rc = waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(child->pidfd.native_handle()),
                &info, WEXITED | WNOHANG);
  } while (rc < 0 && errno == EINTR);
  if ((rc == 0 && info.si_pid == 0) || (rc != 0 && errno == EAGAIN)) {
    // Not exited yet: a spurious readiness (Asio may hand a recycled descriptor state a stale
    // event when file descriptor numbers are reused within one reactor batch). Wait again.
    child->pidfd.async_wait(asio::posix::stream_descriptor::wait_read,
                            [this, pid](const boost::system::error_code& ec) {
                              if (!ec) on_pidfd_ready(pid);
                            });
    return;
  }
  if (rc != 0) {
    log_warning("waitid on worker pid {} failed: {}", pid, std::strerror(errno));
    info.si_code = CLD_KILLED;
    info.si_status = SIGKILL;
  }
  boost::system::error_code ignored;
  child->pidfd.close(ignored);
  children_.erase(it);
  dead_groups_.push_back(pid);
  // A reparented orphan that exited behind this worker in the kernel's list of children was
  // left by reap_orphan_zombies(); take it now.
  reap_orphan_zombies();
  int exec_errno = 0;
  ssize_t r;
  do {
    r = ::read(child->exec_fd, &exec_errno, sizeof(exec_errno));
  } while (r < 0 && errno == EINTR);
  close_fd(child->exec_fd);
  if (r == static_cast<ssize_t>(sizeof(exec_errno))) {
    std::string hint;
    if (exec_errno == EACCES) hint = "; make it executable (chmod +x) or check the path";
    if (exec_errno == ENOEXEC) hint = "; it is not a binary and has no #! line";
    if (exec_errno == ENOENT) hint = "; if it is a script, check the interpreter in its #! line";
    std::string message =
        fmt::format("cannot execute '{}': {}{}", child->path, std::strerror(exec_errno), hint);
    if (child->callbacks.on_exec_failed) {
      child->callbacks.on_exec_failed(message);
    } else if (child->callbacks.on_exit) {
      log_error("{}", message);
      child->callbacks.on_exit(ExitStatus::exited(127));
    }
    return;
  }
  // Deliver what the worker wrote before it died, then its exit. A dead process left at most
  // one pipe's capacity behind, so that bound reads all of it while a grandchild still writing
  // cannot keep the loop here; its children may keep the pipes open, and start_read goes on
  // for them.
  for (int stream : {1, 2}) {
    if (!child->pipe(stream).is_open()) continue;
    int capacity = ::fcntl(child->pipe(stream).native_handle(), F_GETPIPE_SZ);
    child->read_now(stream, capacity > 0 ? static_cast<size_t>(capacity) : size_t{1} << 20,
                    read_buf_.get());
  }
  if (child->callbacks.on_exit) child->callbacks.on_exit(status_from_siginfo(info));
}

void PosixProcessContext::signal_group(int pid, int signal) {
  if (::killpg(pid, signal) != 0 && errno != ESRCH) {
    log_warning("could not send {} to process group {}: {}", signal_name(signal), pid,
                std::strerror(errno));
  }
}

std::string PosixProcessContext::process_state(int pid) {
  char state = 0;
  if (!read_stat(pid, &state, nullptr)) return "";
  return std::string(1, state);
}

void PosixProcessContext::reap_orphan_zombies() {
  // Asks the kernel, not /proc: peek (WNOWAIT) at the first exited child and reap it unless it
  // is a worker, whose pidfd handler reaps it and calls this again (on_pidfd_ready). The guard
  // is a clone child, invisible here. One system call when nothing exited.
  while (true) {
    siginfo_t info;
    std::memset(&info, 0, sizeof(info));
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == EINTR) continue;
      return;  // ECHILD: no children at all
    }
    if (info.si_pid == 0 || children_.count(info.si_pid)) return;
    while (waitpid(info.si_pid, nullptr, WNOHANG) < 0 && errno == EINTR) {
    }
  }
}

bool PosixProcessContext::may_have_untracked_children() {
  reap_orphan_zombies();
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  int rc;
  do {
    rc = waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return false;  // ECHILD: no child but the guard (a clone child, not counted)
  // Some child exists. If every one were a tracked worker, children_ would account for them all,
  // but the kernel gives no count: only /proc can tell. Not knowing is "yes".
  return true;
}

std::vector<std::pair<int, int>> PosixProcessContext::untracked_descendants() {
  std::map<int, std::vector<int>> kids;
  ++proc_scans_;
  for (const auto& [pid, ppid] : process_parents()) kids[ppid].push_back(pid);
  std::vector<std::pair<int, int>> todo;
  const int self = getpid();
  for (int pid : kids[self]) {
    // Workers (and stack captures) are tracked: their exits come through pidfds, and whatever
    // they started is in their process group. The guard must live until the agent exits.
    if (children_.count(pid) || pid == guard_.pid()) continue;
    todo.emplace_back(pid, self);
  }
  // Parents before their children: once a parent is SIGKILLed it forks no more.
  for (size_t i = 0; i < todo.size(); ++i) {
    int pid = todo[i].first;
    auto it = kids.find(pid);
    if (it == kids.end()) continue;
    for (int child : it->second) todo.emplace_back(child, pid);
  }
  return todo;
}

namespace {

using SteadyTime = std::chrono::steady_clock::time_point;

// A bounded clean-up after the group has stopped, not exit monitoring: short sleeps keep the
// waits of kill_orphans from spinning while the kernel tears processes down.
void pause_briefly() { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }

// Waits until every process in `killed` (pid -> pidfd) has exited and, if ours, been reaped,
// adding each to `gone`; up to `deadline`.
void wait_killed(const std::map<int, int>& killed, std::set<int>& gone, SteadyTime deadline) {
  const int self = getpid();
  while (true) {
    for (const auto& [pid, fd] : killed) {
      if (gone.count(pid)) continue;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 0) != 1) continue;
      pid_t r;
      do {
        r = waitpid(pid, nullptr, WNOHANG);
      } while (r < 0 && errno == EINTR);
      // A killed process whose parent (killed too) has not finished dying is that parent's
      // zombie, not yet ours: marked gone then, it came to us a moment later and stayed a
      // zombie after the sweep (OrphanSweep.OrphanTreeOutsideTheGroupIsKilledAtTeardown
      // failed about 1 run in 20). Wait for it unless another, live process is its parent.
      if (r == 0) continue;
      if (r < 0 && errno == ECHILD) {
        int ppid = 0;
        if (read_stat(pid, nullptr, &ppid) && (ppid == self || killed.count(ppid))) continue;
      }
      gone.insert(pid);
    }
    if (gone.size() == killed.size() || std::chrono::steady_clock::now() >= deadline) break;
    pause_briefly();
  }
}

}  // namespace

std::vector<std::string> PosixProcessContext::kill_orphans(Duration timeout) {
  const auto start = std::chrono::steady_clock::now();
  drain_dead_groups(start + timeout / 2);
  std::map<int, int> killed;  // pid -> pidfd
  std::set<int> gone;
  if (may_have_untracked_children()) kill_untracked(start + timeout, killed, gone);
  release_dead_groups();
  // Whatever signal_leftovers() pinned was killed above (or is reported below); its watches
  // end here, so on_gone can no longer run.
  forget_leftovers();
  std::vector<std::string> out;
  for (const auto& [pid, fd] : killed) {
    if (!gone.count(pid)) {
      std::string state = process_state(pid);  // the pidfd still pins the pid
      if (!state.empty()) out.push_back(fmt::format("pid {} (state {})", pid, state));
    }
    ::close(fd);
  }
  return out;
}

// The caller has SIGKILLed the workers' groups. A member's children are reparented to us when
// it exits, so wait (for half the bound at most) until the groups of reaped workers are empty:
// then one look finds every orphan. Members reparented to us become our zombies; P_PGID reaps
// exactly those (no worker we track leads or sits in such a group).
void PosixProcessContext::drain_dead_groups(std::chrono::steady_clock::time_point deadline) {
  while (true) {
    bool busy = false;
    for (int pg : dead_groups_) {
      if (lingering_groups_.count(pg)) continue;
      siginfo_t info;
      do {
        std::memset(&info, 0, sizeof(info));
      } while (waitid(P_PGID, static_cast<id_t>(pg), &info, WEXITED | WNOHANG) == 0 &&
               info.si_pid != 0);
      if (::killpg(pg, 0) == 0) busy = true;
    }
    if (!busy || std::chrono::steady_clock::now() >= deadline) break;
    pause_briefly();
  }
}

// Orphans that left the workers' groups (setsid, a daemon) are our children now. The kernel says
// whether we have any child at all; only then is /proc read, once (plus once more after a kill,
// for anything forked while we looked). With many agents on one host, reading every process's
// stat on each teardown was the agents' main cost (docs/benchmarks.md, "Agents at scale").
// Each one is pinned with a pidfd and checked to still have the parent the scan saw (or us, its
// parent having died since) before it is signalled, so a pid that was freed and reused after the
// scan is never hit; the pidfd also says when it has exited.
void PosixProcessContext::kill_untracked(std::chrono::steady_clock::time_point deadline,
                                         std::map<int, int>& killed, std::set<int>& gone) {
  while (true) {
    bool found_new = false;
    for (const auto& [pid, parent] : untracked_descendants()) {
      if (killed.count(pid)) continue;
      int fd = pin_descendant(pid, parent);
      if (fd < 0) continue;
      log_info("killing orphaned descendant pid {}", pid);
      ::syscall(SYS_pidfd_send_signal, fd, SIGKILL, nullptr, 0);
      killed[pid] = fd;
      found_new = true;
    }
    // Until each has exited; our children (now, or once their parent died) are reaped.
    wait_killed(killed, gone, deadline);
    if (!found_new || std::chrono::steady_clock::now() >= deadline) break;
  }
}

// A group whose members are all gone leaves the guard's list, so its id can never hit an
// unrelated process group that reuses it later. One that is not empty by now (a member in D
// state) is not waited for again by later teardowns.
void PosixProcessContext::release_dead_groups() {
  std::vector<int> live;
  for (int pg : dead_groups_) {
    if (::killpg(pg, 0) != 0 && errno == ESRCH) {
      guard_.remove_group(pg);
      lingering_groups_.erase(pg);
    } else {
      live.push_back(pg);
      lingering_groups_.insert(pg);
    }
  }
  dead_groups_ = live;
}

namespace {

// "pid 123 (python3 upload.py)": the command line, cut, so the user recognises the process;
// the command name when the command line is empty (a kernel thread, a zombie) or unreadable.
std::string describe_process(int pid) {
  constexpr size_t kMaxShown = 120;
  char path[48];
  std::snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
  std::string cmd;
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[512];
    ssize_t n;
    do {
      n = ::read(fd, buf, sizeof(buf));
    } while (n < 0 && errno == EINTR);
    ::close(fd);
    if (n > 0) cmd.assign(buf, static_cast<size_t>(n));
  }
  while (!cmd.empty() && cmd.back() == '\0') cmd.pop_back();
  std::replace(cmd.begin(), cmd.end(), '\0', ' ');
  if (cmd.empty()) {
    std::snprintf(path, sizeof(path), "/proc/%d/comm", pid);
    fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      char buf[64];
      ssize_t n = ::read(fd, buf, sizeof(buf));
      ::close(fd);
      if (n > 0) cmd.assign(buf, static_cast<size_t>(n));
      while (!cmd.empty() && cmd.back() == '\n') cmd.pop_back();
    }
  }
  if (cmd.size() > kMaxShown) cmd = cmd.substr(0, kMaxShown) + "...";
  return fmt::format("pid {} ({})", pid, cmd.empty() ? "?" : cmd);
}

bool pidfd_exited(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

}  // namespace

struct PosixProcessContext::Leftover {
  explicit Leftover(asio::io_context& io) : pidfd(io) {}
  asio::posix::stream_descriptor pidfd;
  std::string name;
};

std::vector<std::string> PosixProcessContext::signal_leftovers(int signal,
                                                               std::function<void()> on_gone) {
  std::vector<std::string> out;
  if (!may_have_untracked_children()) return out;
  // Every worker has exited, so whatever still runs below the agent was left by them: members
  // of their groups have come to the agent (a child subreaper) with their parents' deaths, and
  // so did processes that left the groups (setsid). Pinned as kill_orphans pins them: checked
  // to still have the parent the scan saw before a signal is sent through the pidfd.
  for (const auto& [pid, parent] : untracked_descendants()) {
    auto it = leftovers_.find(pid);
    if (it == leftovers_.end()) {
      int fd = pin_descendant(pid, parent);
      if (fd < 0) continue;
      auto leftover = std::make_shared<Leftover>(io_);
      leftover->pidfd.assign(fd);
      leftover->name = describe_process(pid);
      it = leftovers_.emplace(pid, leftover).first;
      watch_leftover(pid, leftover);
    }
    ::syscall(SYS_pidfd_send_signal, it->second->pidfd.native_handle(), signal, nullptr, 0);
    out.push_back(it->second->name);
  }
  if (!leftovers_.empty()) on_leftovers_gone_ = std::move(on_gone);
  return out;
}

// The pidfd turns readable when the process exits: no polling while a leftover finishes.
void PosixProcessContext::watch_leftover(int pid, const std::shared_ptr<Leftover>& leftover) {
  leftover->pidfd.async_wait(
      asio::posix::stream_descriptor::wait_read,
      [this, pid, leftover](const boost::system::error_code& ec) {
        if (ec || !leftover->pidfd.is_open()) return;  // forgotten (kill_orphans took it)
        if (!pidfd_exited(leftover->pidfd.native_handle())) {
          watch_leftover(pid, leftover);  // a stale readiness (see on_pidfd_ready)
          return;
        }
        reap_orphan_zombies();
        boost::system::error_code ignored;
        leftover->pidfd.close(ignored);
        leftovers_.erase(pid);
        if (leftovers_.empty() && on_leftovers_gone_) {
          auto done = std::move(on_leftovers_gone_);
          on_leftovers_gone_ = nullptr;
          done();
        }
      });
}

std::vector<std::string> PosixProcessContext::live_leftovers() {
  std::vector<std::string> out;
  for (const auto& [pid, leftover] : leftovers_) {
    if (leftover->pidfd.is_open() && !pidfd_exited(leftover->pidfd.native_handle())) {
      out.push_back(leftover->name);
    }
  }
  return out;
}

void PosixProcessContext::forget_leftovers() {
  on_leftovers_gone_ = nullptr;
  for (auto& [pid, leftover] : leftovers_) {
    boost::system::error_code ignored;
    leftover->pidfd.close(ignored);
  }
  leftovers_.clear();
}

}  // namespace dlaunch
