// Runs a command as PID 1 of a new PID namespace (util-linux's `unshare --pid --fork
// --mount-proc`, as a container without an init runs its entrypoint), and looks at the
// namespace's processes from outside, through this host's /proc. Needs root; tests skip with
// the reason pid_namespaces_unavailable() gives.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"

namespace dlaunch::testing {

// Why a PID namespace cannot be made here ("" when it can).
std::string pid_namespaces_unavailable();

// One process of the namespace, as this host sees it.
struct NamespaceProcess {
  pid_t pid = 0;        // in this host's numbering
  pid_t ppid = 0;       // likewise
  char state = 0;       // /proc/<pid>/stat's letter: Z for a zombie
  std::string cmdline;  // arguments joined by spaces; empty for a zombie
};

class PidNamespace {
 public:
  // Starts `argv` (argv[0] a path) as the namespace's PID 1, with `env` added. Blocks until
  // that process runs `program` (argv[0] itself, or what argv[0] execs, as env does), up to
  // 30 s; init_pid() is 0 when it never did.
  PidNamespace(const std::string& program, const std::vector<std::string>& argv,
               const std::map<std::string, std::string>& env = {});

  // PID 1 of the namespace, in this host's numbering: the process to signal.
  pid_t init_pid() const { return init_pid_; }
  // Every process now in the namespace, PID 1 included.
  std::vector<NamespaceProcess> processes() const;
  // Waits for unshare, which exits with PID 1's code (128 + N when a signal N ended it).
  std::optional<ExitInfo> wait(std::chrono::milliseconds timeout) {
    return unshare_->wait(timeout);
  }
  std::string out() const { return unshare_->out(); }
  std::string err() const { return unshare_->err(); }

 private:
  std::unique_ptr<Subprocess> unshare_;
  pid_t init_pid_ = 0;
  std::string namespace_id_;  // readlink of /proc/<init>/ns/pid: "pid:[4026532...]"
};

}  // namespace dlaunch::testing
