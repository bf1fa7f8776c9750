// The signals dlaunch receives. SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 are forwarded to
// every worker's process group; SIGINT/SIGTERM/SIGHUP then stop the job (a second one skips the
// grace period); SIGUSR1 also records the preemption notice (exit 75). SIGCHLD reaps reparented
// orphans. A signal the caller ignored (nohup: SIGHUP) stays ignored. Loop thread only.
#pragma once

#include <boost/asio/signal_set.hpp>

namespace dlaunch {

struct AgentCore;

class AgentSignals {
 public:
  explicit AgentSignals(AgentCore& agent);

  // Starts receiving the signals above (AgentOptions::handle_signals).
  void install();
  // What a signal does; also `dlaunch stop` (as SIGTERM).
  void on_signal(int sig);
  // No more signals (the loop ends).
  void cancel();

 private:
  AgentCore& agent_;
  boost::asio::signal_set signals_;

  void wait();
  // Sends `sig` to every running worker's group.
  void forward(int sig);
  void on_user_signal(int sig);
  void stop_job(int sig);
};

}  // namespace dlaunch
