#include "launcher/agent/agent_signals.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "common/log.h"

namespace dlaunch {

AgentSignals::AgentSignals(AgentContext& agent) : agent_(agent), signals_(agent.io) {}

void AgentSignals::install() {
  // The stop signals are --signals_to_handle's (SIGTERM, SIGINT, SIGHUP, SIGQUIT by default);
  // the others always have the meaning described in agent_signals.h.
  std::vector<int> handled = agent_.cfg.stop_signals;
  for (int s : {SIGUSR1, SIGUSR2, SIGTSTP, SIGCONT, SIGCHLD}) {
    if (std::find(handled.begin(), handled.end(), s) == handled.end()) handled.push_back(s);
  }
  for (int s : handled) {
    // A signal our caller ignored (nohup: SIGHUP) stays ignored, here and, as nothing handles
    // it, in the workers (spawn() resets only handled signals). SIGCHLD is ours.
    struct sigaction sa {};
    if (s != SIGCHLD && sigaction(s, nullptr, &sa) == 0 && !(sa.sa_flags & SA_SIGINFO) &&
        sa.sa_handler == SIG_IGN) {
      log_info(
          "{} is ignored (as the caller, e.g. nohup, set it): dlaunch and its workers "
          "keep ignoring it",
          signal_name(s));
      continue;
    }
    signals_.add(s);
  }
  wait();
}

void AgentSignals::cancel() {
  boost::system::error_code ignored;
  signals_.cancel(ignored);
}

void AgentSignals::wait() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    Event e{Event::Kind::kSignal};
    e.signal = sig;
    agent_.post(e);
    wait();
  });
}

void AgentSignals::forward(int sig) {
  if (!agent_.group) return;
  for (auto& w : agent_.group->workers()) {
    if (w.running()) agent_.procs.signal_group(w.pid, sig);
  }
}

}  // namespace dlaunch
