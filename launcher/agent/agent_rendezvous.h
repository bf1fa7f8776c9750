// The agent's rendezvous loop: each generation begins with a round (a blocking
// next_rendezvous() on a helper thread, or the single node's own round), events the handler
// pushes while the workers run (membership change, a restart or shutdown asked by another node,
// the store lost), the verdict on a failure (was a node lost?) and this node's failure
// published for the others. Loop thread, apart from the helper threads it owns.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "rendezvous/handlers/rendezvous_handler.h"

namespace dlaunch {

struct AgentCore;

class RendezvousLoop {
 public:
  explicit RendezvousLoop(AgentCore& agent) : agent_(agent) {}

  // A new generation: a round, then the workers start (agent_workers.h).
  void begin_generation();

  // Asks the rendezvous whether the round's failure spends the budget or a node was lost
  // (RendezvousHandler::settle_failure, up to the keep-alive window) on a helper thread, then
  // continues on the loop with `then`; a store lost meanwhile ends the job, a signal too
  // (interrupt_settling). Only one at a time: the next starts after this one posted back.
  void settle_failure(std::function<void(const FailureVerdict&)> then);
  // True while a verdict is awaited.
  bool settling() const { return settling_; }
  // A signal arrived while settling: the verdict, when it comes, is dropped.
  void interrupt_settling() { settling_ = false; }

  // Publishes this node's failure for the other nodes on a helper thread: against a store host
  // that is cut off (not dead) the call waits for its reply timeout, and the loop must stay free
  // for signals meanwhile. The failure's settle waits for it (settle_failure).
  void report_to_peers(const std::string& report);

  // The agent is being destroyed: threads still blocked (their gate is closed) are let go.
  void detach_threads();

 private:
  AgentCore& agent_;
  // A failure's verdict is awaited from the rendezvous (settle_failure).
  bool settling_ = false;
  std::thread round_thread_;
  std::thread settle_thread_;
  std::thread report_thread_;  // publishes this node's failure (report_to_peers)

  void on_round_done(const RendezvousResult& r);
  // `exit_code`: kWorkersFailed (a timeout, a lost store: another try may work) or
  // kNodeMismatch (the nodes' settings disagree: no try will).
  void on_round_failed(const std::string& msg, int exit_code);
  void on_job_finished_while_waiting(const std::string& msg);
  void on_event(const RendezvousEvent& ev);
  // The job's store is gone (c10d: the agent hosting it died).
  void on_store_lost(const std::string& reason);
  // Our workers are done, others' are not.
  void on_event_after_success(const RendezvousEvent& ev);
  void rejoin_after_success(const RendezvousEvent& ev);
  void on_verdict(int64_t gen, const FailureVerdict& v,
                  const std::function<void(const FailureVerdict&)>& then);
};

}  // namespace dlaunch
