// Hung workers (--hang_timeout): a periodic check of the heartbeat files while the workers
// run, then the stacks of every silent worker (hang_investigation.h), the diagnosis of which one
// is stuck outside a collective (judge_hang), SIGKILL for the silent ones and the group stopped.
// Loop thread only.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <optional>
#include <vector>

#include "launcher/hang_exchange.h"
#include "launcher/hang_investigation.h"

namespace dlaunch {

struct AgentCore;

class HangWatch {
 public:
  explicit HangWatch(AgentCore& agent);

  // Checks the heartbeats every min(--hang_timeout / 4, 500 ms) while the workers run.
  void arm();
  // The group is being stopped: no more checks.
  void stop_checks() { timer_.cancel(); }
  // The job ends: no more checks and no capture in progress.
  void cancel();
  // SIGKILL for the workers silent past --hang_timeout; every stop of the group starts with it
  // (GroupStopper::stop).
  void kill_silent_workers();

 private:
  AgentCore& agent_;
  boost::asio::steady_timer timer_;
  HangInvestigation probe_;  // hung workers' stacks and diagnosis (phase kCapturing)

  void check();
  void log_hung(const std::vector<int64_t>& hung);
  void investigate(const std::vector<int64_t>& suspects);
  HangInvestigation::Options capture_options() const;
  // Names the silent rank that is stuck outside a collective as the root cause (judge_hang),
  // tells the other nodes and stops the group.
  void blame(const std::vector<int64_t>& suspects,
             const std::vector<HangInvestigation::Result>& results);
  // The hang's verdict is final: tell the other nodes and stop the group (unless a request from
  // elsewhere stopped it meanwhile; the report still names the rank stuck elsewhere).
  void end(const std::optional<NodeHangVerdict>& elsewhere);
};

}  // namespace dlaunch
