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
// Finding descendants costs nothing while the job runs: exits come through pidfds, exited
// orphans through waitid() on SIGCHLD, and a worker's own children through its process group.
// /proc is read (one pass over every process on the host) only at teardown, and only when the
// kernel says the agent still has a child it does not track: many agents on one host each
// reading every other's processes was quadratic (docs/benchmarks.md, "Agents at scale").
//
// Throws: the constructor SystemError (prctl, guard); spawn SpawnError/SystemError.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "launcher/process/orphan_guard.h"
#include "launcher/process/process_context.h"

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
  std::vector<std::string> signal_leftovers(int signal, std::function<void()> on_gone) override;
  std::vector<std::string> live_leftovers() override;

  // The orphan guard removes `path` (the job's flash directory, a temporary run directory) if
  // the agent dies without a clean exit (orphan_guard.h). False when the guard cannot take it.
  bool remove_on_agent_death(const std::string& path) override {
    return guard_.remove_on_death(path);
  }
  // The orphan guard's pid (the flash directory's owner record names it: flash_sweep.h).
  pid_t guard_pid() const { return guard_.pid(); }

  // How many times this context has read /proc to find descendants (tests, benchmarks).
  int64_t proc_scans() const { return proc_scans_; }

 private:
  struct Child;
  struct Leftover;
  void watch_leftover(int pid, const std::shared_ptr<Leftover>& leftover);
  void forget_leftovers();
  void on_pidfd_ready(int pid);
  void start_read(const std::shared_ptr<Child>& child, int stream);
  // Reaps exited orphans, then: may a child other than those tracked exist? false only when
  // the kernel says the agent has no child at all (ECHILD; the guard does not count). Cheap.
  bool may_have_untracked_children();
  // One /proc pass: every descendant of the agent except tracked children (and what they
  // started) and the guard, as (pid, parent pid seen); parents before their children.
  std::vector<std::pair<int, int>> untracked_descendants();
  // The steps of kill_orphans: wait for the dead workers' groups to empty, kill (and wait for)
  // descendants outside them, forget the groups that are empty.
  void drain_dead_groups(std::chrono::steady_clock::time_point deadline);
  void kill_untracked(std::chrono::steady_clock::time_point deadline, std::map<int, int>& killed,
                      std::set<int>& gone);
  void release_dead_groups();

  boost::asio::io_context& io_;
  OrphanGuard guard_;
  std::map<int, std::shared_ptr<Child>> children_;  // by pid, until reaped
  std::vector<int> dead_groups_;  // reaped leaders whose group may still have members
  std::set<int> lingering_groups_;  // dead groups still not empty after a teardown's wait
  int64_t proc_scans_ = 0;
  std::unique_ptr<char[]> read_buf_;  // every pipe read lands here and is handed on at once
  // What successful workers left behind (signal_leftovers), by pid, until it exits or
  // kill_orphans takes it.
  std::map<int, std::shared_ptr<Leftover>> leftovers_;
  std::function<void()> on_leftovers_gone_;
};

// Looks `name` up in `path` (colon-separated) as execvp would; returns "" when not found.
// A name containing '/' is returned unchanged.
std::string resolve_program(const std::string& name, const std::string& path);

// Every process on the host as (pid, parent pid), from one pass over /proc/<pid>/stat. Costs
// one open/read per process: the teardown sweep calls it only when the kernel says the agent
// has a child it does not track.
std::vector<std::pair<int, int>> process_parents();

// Children of `parent` (by /proc/<pid>/stat), for tests.
std::vector<int> child_pids(int parent);

}  // namespace dlaunch
