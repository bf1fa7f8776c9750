// How a process ended, read from the native wait status (so exit(9) and death by SIGKILL stay
// distinct, which Boost.Process v1 cannot tell apart). Never blocks, never throws.
#pragma once

#include <string>

namespace dlaunch {

struct ExitStatus {
  bool signaled = false;  // killed by a signal (code is the signal number)
  int code = 0;           // exit code, or signal number when signaled
  bool core_dumped = false;

  bool success() const { return !signaled && code == 0; }
  // "exit code 3", "signal SIGSEGV (11, core dumped)".
  std::string describe() const;
  // The shell's convention: the exit code, or 128 + signal.
  int shell_code() const { return signaled ? 128 + code : code; }
  static ExitStatus exited(int code) { return ExitStatus{false, code, false}; }
  static ExitStatus killed(int signal) { return ExitStatus{true, signal, false}; }
};

// "SIGSEGV" for 11; "SIG37" for signals without a name.
std::string signal_name(int signal);
// Parses "SIGTERM", "TERM", "term" or "15"; returns 0 for anything else.
int parse_signal(const std::string& text);

}  // namespace dlaunch
