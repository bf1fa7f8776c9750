// The agent's rendezvous loop: each generation begins with a round (a blocking
// next_rendezvous() on a helper thread, or the single node's own round), events the handler
// pushes while the workers run (membership change, a restart or shutdown asked by another node,
// the store lost), the verdict on a failure (was a node lost?) and this node's failure
// published for the others. Loop thread, apart from the helper threads it owns.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "launcher/agent/agent_context.h"
#include "rendezvous/handlers/rendezvous_handler.h"

namespace dlaunch {

class RendezvousLoop {
 public:
  explicit RendezvousLoop(AgentContext& agent) : agent_(agent) {}

  // A new generation: a round, then (posted as kRoundFormed) the workers start.
  void begin_generation();
  // A new round while the workers run on (a node was lost, agent_step.h keeping_workers): this
  // node counts itself among those that kept their workers, joins, and the round's nodes agree
  // whether it shrinks the group in place (shrink_agreement.h; kRoundFormed's every_node_kept).
  // On a shrink the workers' namespace is kept for the group's later replacements.
  void begin_keeping_workers();

  // Asks the rendezvous whether the round's failure spends the budget or a node was lost
  // (RendezvousHandler::settle_failure, up to the keep-alive window) on a helper thread, then
  // posts the verdict (kFailureVerdict; step() drops it when a signal or the end came first).
  // Only one at a time: the next starts after this one posted back.
  void settle_failure();

  // Publishes this node's failure for the other nodes on a helper thread: against a store host
  // that is cut off (not dead) the call waits for its reply timeout, and the loop must stay free
  // for signals meanwhile. The failure's settle waits for it (settle_failure).
  void report_to_peers(const std::string& report);

  // The agent is being destroyed: threads still blocked (their gate is closed) are let go.
  void detach_threads();

 private:
  AgentContext& agent_;
  std::thread round_thread_;
  std::thread settle_thread_;
  std::thread report_thread_;  // publishes this node's failure (report_to_peers)

  void round_formed(const RendezvousResult& r, bool every_node_kept = false);
  void on_round_done(const RendezvousResult& r, bool every_node_kept = false);
  // next_rendezvous() on a helper thread; `before` runs on it first and `after` once the round
  // formed (its answer goes with kRoundFormed as every_node_kept). Either may be empty.
  void join_round(std::function<void()> before,
                  std::function<bool(const RendezvousResult&)> after);
  // `exit_code`: kWorkersFailed (a timeout, a lost store: another try may work) or
  // kNodeMismatch (the nodes' settings disagree: no try will).
  void on_round_failed(const std::string& msg, int exit_code);
  void on_job_finished_while_waiting(const std::string& msg);
  void on_event(const RendezvousEvent& ev);
};

}  // namespace dlaunch
