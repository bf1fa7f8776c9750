#include "launcher/early_stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "launcher/exit_status.h"

namespace dlaunch {
namespace {

// One line per signal, prepared before any handler can run: the handler may not format.
char g_lines[NSIG][128];
size_t g_lengths[NSIG];

void on_early_stop_signal(int sig) {
  if (sig > 0 && sig < NSIG) (void)!::write(STDERR_FILENO, g_lines[sig], g_lengths[sig]);
  ::_exit(128 + sig);
}

}  // namespace

void exit_on_early_stop_signals(const std::vector<int>& signals) {
  for (int s : signals) {
    if (s <= 0 || s >= NSIG || s == SIGKILL || s == SIGSTOP) continue;
    struct sigaction old {};
    if (sigaction(s, nullptr, &old) != 0) continue;
    if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN) continue;
    int n = std::snprintf(g_lines[s], sizeof(g_lines[s]),
                          "dlaunch: received %s before any worker started; exiting with %d\n",
                          signal_name(s).c_str(), 128 + s);
    g_lengths[s] = n > 0 ? std::min(static_cast<size_t>(n), sizeof(g_lines[s]) - 1) : 0;
    struct sigaction sa {};
    sa.sa_handler = on_early_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(s, &sa, nullptr);
  }
}

}  // namespace dlaunch
