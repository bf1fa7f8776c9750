// The agent's side of the status endpoint and timeline (agent_monitor.h): it opens them,
// answers /status with a snapshot of the agent's state, and carries out `dlaunch stop` and
// `dlaunch restart`. Loop thread only.
#pragma once

#include <string>

#include "launcher/agent/agent_monitor.h"

namespace dlaunch {

struct AgentCore;

class AgentStatus {
 public:
  explicit AgentStatus(AgentCore& agent) : agent_(agent) {}

  // Creates the monitor over the run directory and serves the endpoint (AgentCore::monitor).
  void start_monitor();

 private:
  AgentCore& agent_;

  NodeStatus snapshot() const;
  // `dlaunch stop` takes the SIGTERM path; `dlaunch restart` the path of a failure elsewhere,
  // so it is counted against --max_restarts and refused when none is left (docs/cli.md).
  ControlAnswer on_control(ControlAction action, const std::string& who);
  ControlAnswer restart(const std::string& who);
};

}  // namespace dlaunch
