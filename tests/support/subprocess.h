// Test helpers that run real programs (dlaunch, the test worker) and look at real processes.
// Everything here blocks with an explicit timeout; nothing throws except on setup failures
// (SystemError), which fail the test.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/free_port.h"

namespace dlaunch::testing {

// A fresh directory under $TMPDIR, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct ExitInfo {
  bool signaled = false;
  int code = 0;  // exit code or signal number
  int shell_code() const { return signaled ? 128 + code : code; }
};

// A child process with stdout and stderr captured into files.
class Subprocess {
 public:
  // `env` entries are added to (or replace) this process's environment.
  Subprocess(const std::vector<std::string>& argv,
             const std::map<std::string, std::string>& env = {});
  ~Subprocess();  // SIGKILLs and reaps the child if still running
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Waits up to `timeout` for the exit; nullopt on timeout.
  std::optional<ExitInfo> wait(std::chrono::milliseconds timeout);
  void signal(int sig);
  std::string out() const;
  std::string err() const;

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  TempDir dir_;
};

struct RunResult {
  ExitInfo exit;
  bool timed_out = false;
  std::string out;
  std::string err;
};
// Runs to completion (SIGKILL after `timeout`).
RunResult run(const std::vector<std::string>& argv,
              const std::map<std::string, std::string>& env = {},
              std::chrono::milliseconds timeout = std::chrono::seconds(60));

// `argv` run through coreutils' env with the signals a test sends (HUP, INT, TERM, USR1, USR2)
// reset to their default disposition: dlaunch keeps ignoring what its caller ignored (nohup),
// and a background job of a non-interactive shell, which may run the tests, ignores SIGINT.
std::vector<std::string> with_default_signals(std::vector<std::string> argv);

// Polls `pred` every 10 ms until it holds or `timeout` passes; returns the last result.
bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout);

// Waits up to `timeout` until the test workers of local ranks 0..n-1 have written their
// "ready.<rank>" files into `dir` (the test worker's ready=DIR argument).
bool wait_ready(const TempDir& dir, int n, std::chrono::milliseconds timeout);

// True while `pid` exists and is not a zombie.
bool process_alive(pid_t pid);

// The processes (zombies included) whose parent is `parent`, read from /proc.
std::vector<pid_t> children_of(pid_t parent);

std::string read_file(const std::string& path);
// A /proc file of a process that may exit while it is read: "" then (read_file's ifstream
// throws when read() fails with ESRCH).
std::string read_proc_file(const std::string& path);
bool file_exists(const std::string& path);
// How many times `what` occurs in `text` (overlaps counted).
inline size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}
// Lines of `text` that start with `prefix`.
std::vector<std::string> lines_with_prefix(const std::string& text, const std::string& prefix);

}  // namespace dlaunch::testing
