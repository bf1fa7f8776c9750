// The dlaunch agent: one per node. It meets the other agents (rendezvous), starts the local
// workers with the torchrun environment contract, supervises them and ends with one exit code.
//
// Threading: run() drives an Asio io_context on the calling thread, and all agent state is
// touched only there (no locks). Worker exits arrive from the process context (pidfds), signals
// through a signal_set, timers are deadlines (grace, hang checks), never exit polling. A blocking
// rendezvous round runs on a helper thread that posts its result back; workers are still spawned
// on the loop thread.
//
// Per generation (see worker_group.h for the group's state machine; every step of the agent's
// own is step() in agent_step.h, every event in every phase tested as a table):
//   rendezvous (a round that fails ends the agent: exit 78 when the nodes' settings disagree,
//   else 1) -> spawn workers (Init -> Healthy) -> supervise (a failed or hung worker that
//   announced rank_recovery may be replaced alone while the rest go on: rank_replacement.h)
//   -> the group reaches a final state
//   -> stop whatever still runs (first signal, --shutdown_grace, SIGKILL to the group, then
//   reparented orphans; what does not die within a bound is reported and abandoned; after a
//   success, what the workers left running may finish within --shutdown_grace, then gets
//   SIGTERM, with warnings naming it)
//   -> decide (agent_decision.h), from the group's state, the one recorded stop cause and the
//      budget; the first line that applies wins:
//   -> after a preemption notice (SIGUSR1), whatever followed: exit 75
//   -> stopped by a signal N: exit 128+N
//   -> the program cannot be executed: exit 2
//   -> Succeeded: exit 0 (several nodes: after the exit barrier)
//   -> the job's store is lost, or another node closed the job: exit 1
//   -> stopped by a membership change: new generation without spending the budget
//      (a node lost while every local worker announced rank_recovery does not stop the
//      workers: the agent re-rendezvouses with them kept, and a round of exactly the nodes
//      that kept theirs shrinks the group in place, its new ranks told through the store,
//      free; any other round restarts the group in that round, free: shrink_agreement.h)
//   -> Failed/Unhealthy, or another node failed: on several nodes, first ask the rendezvous
//      whether a node was lost (then a new generation without spending the budget); else
//      restart (new generation, TORCHELASTIC_RESTART_COUNT + 1) while --max_restarts lasts,
//      else print the failure report and exit 1
//
// Signals: SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2 are forwarded to every worker's process
// group. SIGINT/SIGTERM/SIGHUP then stop the job (a second one skips the grace period).
// SIGUSR1 also marks the job preempted. Never throws from run(); errors become exit codes.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "launcher/agent/agent_options.h"
#include "launcher/agent/exit_codes.h"
#include "launcher/config/launch_config.h"
#include "launcher/process/process_context.h"

namespace boost::asio {
class io_context;
}

namespace dlaunch {

class Agent {
 public:
  Agent(LaunchConfig cfg, ProcessContext& procs, boost::asio::io_context& io, AgentOptions opts);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs the job to its end on this thread; returns dlaunch's exit code.
  int run();

  // What happened, for tests and the benchmark.
  int64_t restarts_used() const;
  int64_t generations() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The agent's environment as (key, value) pairs.
std::vector<std::pair<std::string, std::string>> current_environment();

}  // namespace dlaunch
