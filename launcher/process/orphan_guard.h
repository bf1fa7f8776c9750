// Kills the workers' process groups when the agent dies without cleaning up (SIGKILL, OOM
// killer, a crash). Workers die with the agent through their parent-death signal, but their
// children do not: the kernel only signals direct children. The guard is a tiny process forked
// at start-up that blocks reading a pipe from the agent; the agent tells it which process groups
// are live. When the pipe reaches end-of-file without a "clean exit" record, the agent is gone,
// and the guard SIGKILLs every group it knows, removes the paths it was given (the job's flash
// directory: unmounted if it is a mount point, then deleted with its contents), then exits.
//
// It covers everything that stays in a worker's process group (the default for children,
// DataLoader workers, shells). A descendant that calls setsid() leaves the group; while the
// agent lives it is still caught as a reparented orphan (the agent is a subreaper), but after
// an agent SIGKILL only the process group is reachable. docs/troubleshooting.md says so.
//
// The guard is the agent's child but a "clone child" (no exit signal): plain waitid() calls do
// not see it, so "the agent has no child left" can be asked of the kernel (ECHILD) without a
// /proc scan, and reaping reparented orphans never takes the guard's exit by mistake.
//
// Threading: one owner thread (the agent's loop). Never blocks except stop(), which waits for
// the guard to exit (immediate; at most a second, then SIGKILL, if the guard is stopped). Throws SystemError when the guard cannot be started.
#pragma once

#include <sys/types.h>

#include <string>

namespace dlaunch {

class OrphanGuard {
 public:
  OrphanGuard();
  ~OrphanGuard();  // calls stop()
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  void add_group(pid_t pgid);
  void remove_group(pid_t pgid);
  // A directory to unmount (lazily) and delete when the agent dies without a clean exit, after
  // the groups are killed. At most 4 paths of up to 4095 bytes; longer ones are refused
  // (returns false, nothing sent).
  bool remove_on_death(const std::string& path);
  // Clean exit: the guard exits without killing anything. Idempotent. Returns within about a
  // second even when the guard cannot run (SIGSTOPped): it is then SIGKILLed.
  void stop();
  pid_t pid() const { return pid_; }

 private:
  void send(char op, pid_t pgid);
  int fd_ = -1;
  pid_t pid_ = -1;
};

}  // namespace dlaunch
