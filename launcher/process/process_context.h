// The agent's window onto processes: start, signal, and learn of exits and output lines. The
// agent's logic talks only to this interface, so it can be unit-tested with a fake; the real one
// (posix_process_context.h) forks and execs, and watches pidfds and pipes on the agent's
// io_context.
//
// Threading: every method must be called on the agent's event-loop thread, and callbacks run on
// it. Spawning from that one thread matters: the parent-death signal is tied to the thread that
// forked, so a worker spawned from a short-lived thread would die with that thread.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/error.h"
#include "launcher/process/exit_status.h"

namespace dlaunch {

// The program could not be started: not found, not executable, bad interpreter. The message
// names the path and the reason; it is meant for the user as is.
class SpawnError : public SystemError {
 public:
  using SystemError::SystemError;
};

struct SpawnRequest {
  // argv[0] is the program: a path, or a bare name looked up in the PATH of `env`.
  std::vector<std::string> argv;
  // The complete environment of the new process ("KEY", "value"); nothing else is inherited.
  std::vector<std::pair<std::string, std::string>> env;
  // true: stdout and stderr come back through on_output; false: they are inherited.
  bool capture_output = true;
};

struct ProcessCallbacks {
  // The bytes the process wrote, exactly once and in order per stream, in chunks of any size
  // (a chunk may end mid-line); stream 1 = stdout, 2 = stderr. Everything written before the
  // process exited is delivered before on_exit; its children may still write after.
  std::function<void(int stream, std::string_view bytes)> on_output;
  // Exactly once, when the process has exited and been reaped, unless on_exec_failed is called
  // instead.
  std::function<void(const ExitStatus&)> on_exit;
  // Instead of on_exit when the program could not be executed (EACCES, ENOEXEC, a missing #!
  // interpreter): a message for the user naming the path and the reason.
  std::function<void(const std::string& message)> on_exec_failed;
};

class ProcessContext {
 public:
  virtual ~ProcessContext() = default;

  // Starts a process that leads its own process group and cannot outlive the agent. Returns its
  // pid right after fork: it does not wait for the exec, so several workers start in parallel.
  // Throws SpawnError when the program is not found (then nothing was started), SystemError when
  // fork or a pipe fails. A program found but not executable is reported through
  // on_exec_failed.
  virtual int spawn(const SpawnRequest& request, ProcessCallbacks callbacks) = 0;

  // Sends `signal` to the process group led by `pid` (the process and the children it did not
  // move elsewhere). Quietly does nothing when the group is gone. Never blocks.
  virtual void signal_group(int pid, int signal) = 0;

  // SIGKILLs every process that was reparented to the agent (grandchildren whose parent died;
  // the agent is a child subreaper) and is not a process spawned here, and their descendants,
  // then reaps them, within `timeout`. Call it after SIGKILLing the workers' groups: it first
  // waits (half the bound at most) for those groups to empty, so their members' children have
  // come to the agent. Blocks up to `timeout`. Returns "pid (state)" for each one that would
  // not die (e.g. state D), so the caller can report it instead of waiting forever.
  virtual std::vector<std::string> kill_orphans(Duration timeout) = 0;

  // After every worker of the group exited 0: what they left running (the members of their
  // process groups and the descendants reparented to the agent, e.g. an uploader started with
  // Popen). Sends `signal` to each (0: none, only pin and watch), and keeps each pinned (a pidfd) so a reused pid is never
  // hit. Returns them as "pid 123 (python3 upload.py)"; empty when nothing is left, and then
  // `on_gone` is never called. Otherwise `on_gone` runs once, on the loop, when every one of
  // them has exited; never after kill_orphans(), which takes whatever is left. Reads /proc
  // once, and only when the kernel says the agent has a child it does not track. Never blocks.
  virtual std::vector<std::string> signal_leftovers(int signal, std::function<void()> on_gone) = 0;
  // Those of signal_leftovers() still alive, in the same format. Never blocks.
  virtual std::vector<std::string> live_leftovers() = 0;

  // Reaps reparented orphans that already exited, so they do not pile up as zombies during a
  // long run (the agent calls it on SIGCHLD). Never blocks.
  virtual void reap_orphan_zombies() = 0;

  // One letter from /proc/<pid>/stat (R, S, D, Z, T...), or "" when the process is gone.
  virtual std::string process_state(int pid) = 0;

  // Asks that `path` (a directory of the job's) be removed if the agent dies without a clean
  // exit (SIGKILL, OOM killer); false when that cannot be arranged. Default: cannot.
  virtual bool remove_on_agent_death(const std::string& path) {
    (void)path;
    return false;
  }
};

}  // namespace dlaunch
