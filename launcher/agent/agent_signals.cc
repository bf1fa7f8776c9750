#include "launcher/agent/agent_signals.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "common/log.h"
#include "launcher/agent/agent_core.h"

namespace dlaunch {

AgentSignals::AgentSignals(AgentCore& agent) : agent_(agent), signals_(agent.io) {}

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
    on_signal(sig);
    wait();
  });
}

void AgentSignals::forward(int sig) {
  if (!agent_.group) return;
  for (auto& w : agent_.group->workers()) {
    if (w.running()) agent_.procs.signal_group(w.pid, sig);
  }
}

void AgentSignals::on_signal(int sig, const std::string& by) {
  if (sig == SIGCHLD) {
    agent_.procs.reap_orphan_zombies();
    return;
  }
  if (sig == SIGTSTP || sig == SIGCONT) return on_job_control(sig);
  if (agent_.phase == AgentPhase::kDone) return;
  if (by.empty()) agent_.monitor->events().emit("signal_received", {{"signal", signal_name(sig)}});
  const bool user_signal = sig == SIGUSR1 || sig == SIGUSR2;
  if (agent_.phase == AgentPhase::kExitBarrier) {
    // Only the exit barrier is left: a terminating signal ends the wait.
    if (!user_signal) agent_.finish_now(exit_codes::kSignalBase + sig);
    return;
  }
  if (agent_.rendezvous.settling() && !user_signal) {
    // The workers are stopped and only a failure's verdict is awaited: do not wait for it.
    agent_.cause.record_signal(sig);
    agent_.rendezvous.interrupt_settling();
    log_warning("received {} while settling a failure; stopping", signal_name(sig));
    return agent_.finish_now(exit_codes::kSignalBase + sig);
  }
  if (user_signal) return on_user_signal(sig);
  if (agent_.cause.signal != 0 && agent_.phase == AgentPhase::kStopping) {
    log_warning("received {} again {:.1f} s after the stop signal; killing the workers now",
                signal_name(sig),
                to_seconds(agent_.opts.clock->now() - agent_.stopper.stop_started()));
    agent_.stopper.kill_now();
    return;
  }
  stop_job(sig, by);
}

// The workers lead their own process groups, so the terminal's Ctrl-Z (SIGTSTP to dlaunch's
// group) would stop dlaunch alone while they train on: pass it on, then stop as the default
// action would have. SIGSTOP, as SIGTSTP is handled here. `fg` continues dlaunch (SIGCONT), which
// continues the workers.
void AgentSignals::on_job_control(int sig) {
  if (sig == SIGTSTP) {
    log_info("received SIGTSTP; stopping the workers and dlaunch (fg or SIGCONT resumes them)");
    agent_.hangs.pause();
    forward(SIGTSTP);
    ::kill(::getpid(), SIGSTOP);
    return;
  }
  agent_.hangs.resumed(agent_.opts.clock->now());
  forward(SIGCONT);
  log_info("received SIGCONT; the workers go on");
}

void AgentSignals::on_user_signal(int sig) {
  log_info("received {}; forwarding it to every worker", signal_name(sig));
  forward(sig);
  if (sig == SIGUSR1 && !agent_.cause.is(StopKind::kPreempted)) {
    agent_.cause.record(StopKind::kPreempted);
    log_warning("SIGUSR1 is the preemption notice: when the workers stop, dlaunch exits "
                "with {} (requeue) and does not restart them",
                exit_codes::kPreempted);
  }
}

void AgentSignals::stop_job(int sig, const std::string& by) {
  agent_.cause.record_signal(sig);
  if (by.empty()) {
    log_warning("received {}; forwarding it to every worker and stopping the job",
                signal_name(sig));
  } else {
    log_warning("stop requested by {}; sending {} to every worker and stopping the job", by,
                signal_name(sig));
  }
  switch (agent_.phase) {
    case AgentPhase::kRendezvous:
      agent_.finish(exit_codes::kSignalBase + sig);
      return;
    case AgentPhase::kRunning:
    case AgentPhase::kCapturing:
      // A healthy group stopped by a signal is this node leaving (Kubernetes deleting its pod):
      // the others are told before its workers die, so the failures that causes in theirs are
      // not charged. A hang being investigated is a failure already, and stays one.
      if (agent_.opts.rendezvous && agent_.phase == AgentPhase::kRunning) {
        agent_.opts.rendezvous->begin_leaving();
      }
      agent_.group->on_stop_requested(fmt::format("dlaunch received {}", signal_name(sig)));
      agent_.phase = AgentPhase::kRunning;  // a capture in progress is abandoned
      agent_.stop_group(sig);
      return;
    case AgentPhase::kStopping:
      forward(sig);
      return;
    case AgentPhase::kExitBarrier:
    case AgentPhase::kDone:
      return;
  }
}

}  // namespace dlaunch
