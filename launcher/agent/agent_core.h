// The agent's state and the steps that end a generation (decide, restart, finish), shared by the
// parts that each do one job over it (agent.h says what the agent does as a whole):
//
//   agent_rendezvous.h  the rendezvous loop: rounds, pushed events, failure verdicts, reports
//   agent_workers.h     starting a generation's workers and seeing them exit
//   agent_hangs.h       heartbeat checks, stacks and the diagnosis of hung workers
//   agent_stopping.h    stopping the group: grace, SIGKILL, what the workers left behind
//   agent_signals.h     the signals dlaunch receives
//   agent_status.h      the status endpoint and control requests (agent_monitor.h)
//
// Everything here runs on the loop thread; helper threads come back through `gate`. The parts
// hold a reference to the core and are members of it, so they live exactly as long.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/agent/agent.h"
#include "launcher/agent/agent_decision.h"
#include "launcher/agent/agent_hangs.h"
#include "launcher/agent/agent_monitor.h"
#include "launcher/agent/agent_rendezvous.h"
#include "launcher/agent/agent_signals.h"
#include "launcher/agent/agent_status.h"
#include "launcher/agent/agent_stopping.h"
#include "launcher/agent/agent_workers.h"
#include "launcher/hang/hang_exchange.h"
#include "launcher/agent/post_gate.h"
#include "launcher/agent/worker_files.h"
#include "launcher/process/worker_group.h"
#include "rendezvous/handlers/rendezvous_handler.h"

namespace dlaunch {

// What the agent is doing; /status shows it (agent_phase_name).
enum class AgentPhase { kRendezvous, kRunning, kCapturing, kStopping, kExitBarrier, kDone };
const char* agent_phase_name(AgentPhase p);

struct AgentCore {
  std::shared_ptr<PostGate> gate;
  LaunchConfig cfg;
  ProcessContext& procs;
  boost::asio::io_context& io;
  AgentOptions opts;

  AgentPhase phase = AgentPhase::kRendezvous;
  // Why the agent stops the group, if the workers do not end on their own; decide() reads it
  // when the group is down (agent_decision.h).
  StopCause cause;
  int exit_code = 0;
  int64_t generation = -1;  // generations started (DLAUNCH_ATTEMPT)
  int64_t restarts_used = 0;
  int64_t master_port = 0;
  // The rendezvous declared the job's store gone: why, in one sentence (printed by decide()).
  std::string store_lost;
  // Exit barrier: every node is past it (stop_loop then says this node has left).
  bool passed_exit_barrier = false;
  WorkerFiles files;
  std::unique_ptr<WorkerGroup> group;
  std::vector<std::string> earlier_failures;  // for the failure report
  std::vector<std::string> stuck;             // processes that survived SIGKILL
  std::optional<RendezvousResult> last_round;
  std::optional<NodeHangVerdict> stuck_elsewhere;  // this generation's hang, stuck on another node
  std::chrono::system_clock::time_point started_wall = std::chrono::system_clock::now();

  RendezvousLoop rendezvous;
  WorkerSupervisor workers;
  HangWatch hangs;
  GroupStopper stopper;
  AgentSignals signals;
  AgentStatus status;
  // Timeline, status endpoint and control (agent_monitor.h); created by prepare(). Declared
  // after the parts so it goes first: its hooks call into them.
  std::unique_ptr<AgentMonitor> monitor;

  AgentCore(LaunchConfig c, ProcessContext& p, boost::asio::io_context& i, AgentOptions o);

  // Run directory, monitor, OMP threads, ports, signals; before the first generation.
  void prepare();
  // The restart count of the current round: the job-wide one on several nodes.
  int64_t restart_count() const {
    return last_round ? last_round->restart_count : restarts_used;
  }

  // Sends `first` to every running worker's group, then SIGKILL after --shutdown_grace.
  void stop_group(int first);
  // The group and what it left are down: kill what remains in its process groups, then decide.
  void group_stopped();
  // The group is down: what next is agent_decision.h's decide(); this carries it out.
  void decide();
  // Ends the job with `code` (a success on several nodes first passes the exit barrier).
  void finish(int code);
  void finish_now(int code);
  // The agent cannot go on (an unexpected error escaped a handler): nothing may outlive it.
  void emergency_stop();

 private:
  // `node_lost`: the rendezvous's sentence when its verdict was a lost node.
  void act(const DecisionInput& in, const Decision& d, const std::string& node_lost = {});
  void say_why_finished(const DecisionInput& in, const Decision& d);
  void restart_free(const std::string& reason);
  void restart_counted(int64_t restart_count);
  void report_failure(int64_t restart_count);
  void start_exit_barrier();
  void stop_loop();
};

}  // namespace dlaunch
