// What the agent's parts share (agent_core.h lists the parts): the configuration, the process
// context, the current worker group and round, the files and the timeline, and the one way to
// change the lifecycle, post(event), which runs step() (agent_step.h) and has the parts carry out
// its actions. The parts read state() but never write it, and reach each other only through
// actions; they include this header, not the core, so the core knows them and not the reverse.
// Loop thread only; helper threads come back through `gate`.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/agent/agent_monitor.h"
#include "launcher/agent/agent_options.h"
#include "launcher/agent/agent_step.h"
#include "launcher/agent/exit_codes.h"
#include "launcher/agent/post_gate.h"
#include "launcher/agent/rank_replacement.h"
#include "launcher/agent/worker_files.h"
#include "launcher/config/launch_config.h"
#include "launcher/hang/hang_exchange.h"
#include "launcher/process/process_context.h"
#include "launcher/process/worker_group.h"
#include "rendezvous/handlers/rendezvous_handler.h"

namespace boost::asio {
class io_context;
}

namespace dlaunch {

class AgentContext {
 public:
  AgentContext(LaunchConfig c, ProcessContext& p, boost::asio::io_context& i, AgentOptions o)
      : gate(std::make_shared<PostGate>(i)),
        cfg(std::move(c)),
        procs(p),
        io(i),
        opts(std::move(o)) {}
  virtual ~AgentContext() = default;
  AgentContext(const AgentContext&) = delete;
  AgentContext& operator=(const AgentContext&) = delete;

  std::shared_ptr<PostGate> gate;
  LaunchConfig cfg;
  ProcessContext& procs;
  boost::asio::io_context& io;
  AgentOptions opts;

  int64_t master_port = 0;
  WorkerFiles files;
  std::unique_ptr<WorkerGroup> group;
  std::vector<std::string> earlier_failures;  // for the failure report
  std::vector<std::string> stuck;             // processes that survived SIGKILL
  std::optional<RendezvousResult> last_round;
  std::optional<NodeHangVerdict> stuck_elsewhere;  // this generation's hang, stuck on another node
  // The store side of rank recovery for the current group (off without --restart_scope rank).
  RankRecovery recovery;
  // The round whose worker namespace the group's workers use (rendezvous/tcp/worker_namespace.h):
  // the round the group started in, also after it shrank in place.
  int64_t workers_round = -1;
  // While the round after a lost node forms with the workers kept: the generation the workers
  // last saw; none when it could not be read (then the group restarts instead of shrinking).
  std::optional<int64_t> generation_before_shrink;
  std::chrono::system_clock::time_point started_wall = std::chrono::system_clock::now();
  // Timeline, status endpoint and control; created by AgentStatus::start_monitor.
  std::unique_ptr<AgentMonitor> monitor;

  // The lifecycle: phase, cause, budget, generation, settling (agent_step.h).
  const AgentState& state() const { return state_; }
  // Still generation `gen`, in `phase`: a timer or a helper thread's result still applies.
  bool still(int64_t gen, AgentPhase phase) const {
    return state_.generation == gen && state_.phase == phase;
  }
  // step(state(), e), then its actions carried out in order (an action may post again, as a
  // nested call); returns the actions, for a caller that wants an answer from them.
  virtual std::vector<Action> post(const Event& e) = 0;

 protected:
  AgentState state_;
};

}  // namespace dlaunch
