// The real ProcessContext: fork/exec with explicit hygiene, exits watched through pidfds and
// output through pipes, all on the agent's io_context (no polling, no extra threads).
//
// What each worker gets, in the child between fork and exec:
//   - its own process group (setpgid), so a signal reaches the worker and its children;
//   - PR_SET_PDEATHSIG(SIGKILL), then a getppid() check that closes the race with an agent that
//     died before the prctl; PR_SET_PTRACER(agent) so the agent's stack-capture helpers may
//     attach under Yama ptrace_scope 1;
//   - default dispositions for every signal the agent catches, and for SIGPIPE; an empty mask;
//   - no file descriptor but 0, 1, 2 (close_range marks the rest close-on-exec);
//   - exec failures (EACCES, ENOEXEC, a missing #! interpreter...) sent back through a
//     close-on-exec pipe, so the agent reports them with the path instead of seeing an
//     anonymous exit 127. spawn() does not wait for the exec (workers exec in parallel); the
//     pipe is read when the process exits and turns into on_exec_failed.
// The agent itself becomes a child subreaper, so orphaned grandchildren come back to it, and
// starts an OrphanGuard that kills the worker groups if the agent dies uncleanly.
//
// Throws: the constructor SystemError (prctl, guard); spawn SpawnError/SystemError.
#pragma once

#include <map>
#include <memory>

#include "launcher/orphan_guard.h"
#include "launcher/process_context.h"

namespace boost::asio {
class io_context;
}

namespace dlaunch {

class PosixProcessContext final : public ProcessContext {
 public:
  explicit PosixProcessContext(boost::asio::io_context& io);
  ~PosixProcessContext() override;

  int spawn(const SpawnRequest& request, ProcessCallbacks callbacks) override;
  void signal_group(int pid, int signal) override;
  std::vector<std::string> kill_orphans(Duration timeout) override;
  std::string process_state(int pid) override;
  void reap_orphan_zombies() override;

 private:
  struct Child;
  void on_pidfd_ready(int pid);
  void start_read(const std::shared_ptr<Child>& child, int stream);

  boost::asio::io_context& io_;
  OrphanGuard guard_;
  std::map<int, std::shared_ptr<Child>> children_;  // by pid, until reaped
  std::vector<int> dead_groups_;  // reaped leaders whose group may still have members
};

// Looks `name` up in `path` (colon-separated) as execvp would; returns "" when not found.
// A name containing '/' is returned unchanged.
std::string resolve_program(const std::string& name, const std::string& path);

// Children of `parent` (by /proc/<pid>/stat), for the orphan sweep and tests.
std::vector<int> child_pids(int parent);

}  // namespace dlaunch
