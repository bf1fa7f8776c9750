// dlaunch's hooks for Python workers (python/dlaunch_hooks/sitecustomize.py): where the file is,
// the environment that turns it on, and the request for a worker's Python stacks.
//
// The hooks reach a worker through its environment only: their directory goes first on
// PYTHONPATH, so Python imports dlaunch's sitecustomize (which then runs the one it shadows).
// It heartbeats on every optimizer step and registers faulthandler on kPythonStackSignal, writing
// to the rank's py_stack.txt. The file lies beside the binary: <bin>/../share/dlaunch/python/,
// both in the build tree (build/bin/dlaunch) and installed (P/bin/dlaunch, cmake/Install.cmake).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dlaunch {

inline constexpr const char kPythonHooksFile[] = "sitecustomize.py";
inline constexpr const char kPyStackFileEnv[] = "DLAUNCH_PY_STACK_FILE";
inline constexpr const char kPyStackSignalEnv[] = "DLAUNCH_PY_STACK_SIGNAL";
// The registration line the hooks write first, "dlaunch-python-stacks pid=123 signal=37".
inline constexpr const char kPyStackRegistration[] = "dlaunch-python-stacks pid=";

// SIGRTMIN + 3: a real-time signal no library or script handles by habit (SIGUSR1/2 belong to
// the user and to Slurm's preemption notices).
int python_stack_signal();

// The hooks' directory for a dlaunch binary at `exe` ("/opt/x/bin/dlaunch" -> "/opt/x/share/
// dlaunch/python"), or "" when the file is not there. Reads the file system only.
std::string python_hooks_dir_for(const std::string& exe);
// The same for this process's own binary (/proc/self/exe).
std::string python_hooks_dir();

// Puts `dir` first on PYTHONPATH in `env` (keeping the user's entries after it) and names the
// rank's stack file and the signal. Pure.
void add_python_hooks_env(std::vector<std::pair<std::string, std::string>>& env,
                          const std::string& dir, const std::string& stack_file);

// Asks for Python stacks: appends a marker line to `stack_file` and sends python_stack_signal()
// to the worker (pid `pgid`, the leader of its process group) when it registered in the file,
// else to each process that registered and is still in the worker's group (Python started by a
// wrapper script). Returns the file offset where the
// answers start, or nullopt when no such process registered (then nothing is sent: the signal
// would kill a process without the handler). Never throws, never blocks.
std::optional<uint64_t> request_python_stacks(const std::string& stack_file, int pgid);

// What the file holds from `offset` on (at most 1 MiB), "" when unreadable.
std::string read_python_stacks(const std::string& stack_file, uint64_t offset);

}  // namespace dlaunch
