#include "launcher/agent/early_signals.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "launcher/agent/agent.h"
#include "launcher/process/exit_status.h"

namespace dlaunch {
namespace {

// Per signal: the line, prepared before any handler can run (a handler may not format), and
// the exit code (-1: none, the signal is only noted).
char g_lines[NSIG][160];
size_t g_lengths[NSIG];
int g_exit_codes[NSIG];

void on_early_signal(int sig) {
  if (sig <= 0 || sig >= NSIG) return;
  (void)!::write(STDERR_FILENO, g_lines[sig], g_lengths[sig]);
  if (g_exit_codes[sig] >= 0) ::_exit(g_exit_codes[sig]);
}

void install(int sig, int exit_code, const char* what) {
  if (sig <= 0 || sig >= NSIG || sig == SIGKILL || sig == SIGSTOP) return;
  struct sigaction old {};
  if (sigaction(sig, nullptr, &old) != 0) return;
  if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN) return;
  int n = exit_code >= 0
              ? std::snprintf(g_lines[sig], sizeof(g_lines[sig]),
                              "dlaunch: received %s%s before any worker started; exiting with %d\n",
                              signal_name(sig).c_str(), what, exit_code)
              : std::snprintf(g_lines[sig], sizeof(g_lines[sig]),
                              "dlaunch: received %s before any worker started; nothing to "
                              "forward it to\n",
                              signal_name(sig).c_str());
  g_lengths[sig] = n > 0 ? std::min(static_cast<size_t>(n), sizeof(g_lines[sig]) - 1) : 0;
  g_exit_codes[sig] = exit_code;
  struct sigaction sa {};
  sa.sa_handler = on_early_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // SIGUSR2 returns: the start-up's system calls go on
  sigaction(sig, &sa, nullptr);
}

}  // namespace

void handle_signals_before_the_agent(const std::vector<int>& stop_signals) {
  for (int s : stop_signals) {
    // --signals_to_handle may list signals whose default action is not to end the process
    // (job control, SIGCHLD: the program check's probe exits early on) or that keep their own
    // meaning (SIGUSR1, SIGUSR2, below): those keep theirs until the agent runs.
    switch (s) {
      case SIGCHLD:
      case SIGCONT:
      case SIGTSTP:
      case SIGTTIN:
      case SIGTTOU:
      case SIGWINCH:
      case SIGURG:
      case SIGUSR1:
      case SIGUSR2:
        continue;
      default:
        install(s, exit_codes::kSignalBase + s, "");
    }
  }
  install(SIGUSR1, exit_codes::kPreempted, " (the preemption notice)");
  install(SIGUSR2, -1, "");
}

}  // namespace dlaunch
