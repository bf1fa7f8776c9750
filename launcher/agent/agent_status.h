// The agent's side of the status endpoint and timeline (agent_monitor.h): it opens them,
// answers /status with a snapshot of the agent's state, and carries out `dlaunch stop` and
// `dlaunch restart`. Loop thread only.
#pragma once

#include <string>

#include "launcher/agent/agent_context.h"
#include "launcher/agent/agent_monitor.h"

namespace dlaunch {

class AgentStatus {
 public:
  explicit AgentStatus(AgentContext& agent) : agent_(agent) {}

  // Creates the monitor over the run directory and serves the endpoint (AgentContext::monitor).
  void start_monitor();

 private:
  AgentContext& agent_;

  NodeStatus snapshot() const;
  // `dlaunch stop` takes the SIGTERM path; `dlaunch restart` the path of a failure elsewhere,
  // so it is counted against --max_restarts and refused when none is left (docs/cli.md).
  // step() decides and answers (kAnswer).
  ControlAnswer on_control(ControlAction action, const std::string& who);
};

}  // namespace dlaunch
