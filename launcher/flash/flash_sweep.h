// Stale flash directories: what is left under /dev/shm when an agent AND its orphan guard die
// together (kill -9 of the agent's whole process group, the OOM killer taking both, a job step
// killed hard). Nobody is left to unmount and delete the job's flash directory then, and a tmpfs
// of its own keeps its memory until reboot. The next dlaunch on the host sweeps them.
//
// How a directory is known to be stale: the agent writes an owner record into its flash
// directory as it makes it (FlashDir::create calls write_flash_owner, beneath the tmpfs and in
// it, for sweepers in other mount namespaces and in ours): its pid, its orphan guard's pid,
// each with the process's start time (so a pid the kernel reused is not taken for the owner),
// and the pid namespace they live in. A directory is swept only when all of this holds:
//   - its name is dlaunch_flash_*, it is a real directory (not a link) owned by this user;
//   - its owner record is readable and was written in this pid namespace (elsewhere the pids
//     mean nothing to us);
//   - neither the agent nor the guard is alive (no such pid, a zombie, or another process
//     under that pid).
// A directory without an owner record (made by an older dlaunch, or one still being made) is
// left alone. A mounted one is unmounted (lazily) before its contents are deleted. A tmpfs
// mounted in another mount namespace is not ours to see: it goes when that namespace does (with
// its last process); what is swept here is the directory beneath it.
//
// Threading: call from one thread at start-up. Blocks on the file system only; never throws
// (each failure is logged and that directory is skipped).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace dlaunch {

// The owner record's file name inside a flash directory. Hidden: workers list the directory.
inline constexpr const char kFlashOwnerFile[] = ".dlaunch_owner";

// Writes `dir`/.dlaunch_owner naming `agent_pid` and `guard_pid` (both must be alive: their start
// times are read now) and `run_id`. Returns false (and logs why) when it cannot: the directory
// then is not swept if it is ever left behind.
bool write_flash_owner(const std::string& dir, pid_t agent_pid, pid_t guard_pid,
                       const std::string& run_id);

// Removes every stale flash directory under `base` (see above) and logs each one removed, with
// the run it belonged to and whether its tmpfs was unmounted. Returns the paths removed.
std::vector<std::string> sweep_stale_flash_dirs(const std::string& base);

}  // namespace dlaunch
