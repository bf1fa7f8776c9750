// The signals dlaunch receives. The stop signals (LaunchConfig::stop_signals, --signals_to_handle:
// SIGTERM, SIGINT, SIGHUP, SIGQUIT by default), SIGUSR1 and SIGUSR2 are forwarded to every
// worker's process group; a stop signal then stops the job (a second one skips the grace
// period); SIGUSR1 also records the preemption notice (exit 75). SIGCHLD reaps reparented
// orphans. SIGTSTP (Ctrl-Z) is forwarded, then dlaunch stops itself; SIGCONT is forwarded and
// restarts the hang clock. A signal the caller ignored (nohup: SIGHUP) stays ignored. Loop
// thread only.
#pragma once

#include <boost/asio/signal_set.hpp>
#include <string>

namespace dlaunch {

struct AgentCore;

class AgentSignals {
 public:
  explicit AgentSignals(AgentCore& agent);

  // Starts receiving the signals above (AgentOptions::handle_signals). Replaces the handler
  // dlaunch's main installs until then (early_signals.h), with no moment between the two
  // when a stop signal has none (PID 1 would lose it). Before any worker is spawned.
  void install();
  // What a signal does; also `dlaunch stop` (as SIGTERM, `by` naming who asked: the log then
  // says that instead of "received SIGTERM").
  void on_signal(int sig, const std::string& by = "");
  // No more signals (the loop ends).
  void cancel();

 private:
  AgentCore& agent_;
  boost::asio::signal_set signals_;

  void wait();
  // Sends `sig` to every running worker's group.
  void forward(int sig);
  void on_user_signal(int sig);
  void on_job_control(int sig);
  void stop_job(int sig, const std::string& by);
};

}  // namespace dlaunch
