// The dlaunch agent: one per node. It meets the other agents (rendezvous), starts the local
// workers with the torchrun environment contract, supervises them and ends with one exit code.
//
// Threading: run() drives an Asio io_context on the calling thread, and all agent state is
// touched only there (no locks). Worker exits arrive from the process context (pidfds), signals
// through a signal_set, timers are deadlines (grace, hang checks), never exit polling. A blocking
// rendezvous round runs on a helper thread that posts its result back; workers are still spawned
// on the loop thread.
//
// Per generation (see worker_group.h for the group's state machine):
//   rendezvous (a round that fails ends the agent: exit 78 when the nodes' settings disagree,
//   else 1) -> spawn workers (Init -> Healthy) -> supervise -> the group reaches a final state
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
#include "launcher/config/launch_config.h"
#include "launcher/process/process_context.h"

namespace boost::asio {
class io_context;
}

namespace dlaunch {

class RendezvousHandler;
struct RendezvousResult;
class TcpStoreServer;

namespace exit_codes {
inline constexpr int kSuccess = 0;
inline constexpr int kWorkersFailed = 1;  // torchrun's code for a failed job
inline constexpr int kUsage = 2;          // bad flags, or a program that cannot be executed
inline constexpr int kPreempted = 75;     // EX_TEMPFAIL: stopped after a preemption notice; requeue
// EX_CONFIG: the nodes' settings disagree (rendezvous_handler.h's NodeMismatchError); starting
// them again the same way cannot help.
inline constexpr int kNodeMismatch = 78;
inline constexpr int kSignalBase = 128;   // + N: the agent was stopped by signal N
}  // namespace exit_codes

struct AgentOptions {
  const Clock* clock = &steady_clock();
  std::string host;  // for the report and DLAUNCH_NODE_ID
  // For the failure report: "dlaunch 0.1.0 (commit e8ba0f2, Release build)". main.cc fills it
  // from common/version.h; the launcher library does not link that (it changes every commit).
  std::string version;
  // The environment workers inherit, before the contract is applied on top.
  std::vector<std::pair<std::string, std::string>> base_env;
  bool handle_signals = true;
  // When the worker's heartbeat file was last touched, in this clock's time; nullopt: never.
  // Default: the file's mtime mapped onto the steady clock.
  std::function<std::optional<TimePoint>(const std::string& path)> last_beat;
  // Stack capture for hung workers (eu-stack, else gdb, when installed).
  bool capture_stacks = true;
  // dlaunch's Python hooks (launcher/config/python_hooks.h), put on the workers' PYTHONPATH unless
  // --no_python_hooks; empty: none (main.cc finds them beside the binary).
  std::string python_hooks_dir;
  Duration stack_capture_timeout = std::chrono::seconds(15);
  // How long to wait for processes after SIGKILL before reporting them as stuck.
  Duration kill_wait = std::chrono::seconds(3);
  // Host cores, for OMP_NUM_THREADS = max(1, cores / nproc).
  int64_t cpus = 1;
  // Rendezvous for several nodes; null: a single node that is its own job.
  std::shared_ptr<RendezvousHandler> rendezvous;
  // Single node: where the job's store is (job_services.h). Unset port: --master_port, where
  // 0 picks a free port for the workers' rank 0 to bind (no agent store).
  std::optional<int64_t> master_port;
  std::string master_addr;  // empty: --master_addr
  bool use_agent_store = false;
  // The workers reach the job's store through this node's proxy (--store_proxy; only with
  // use_agent_store: otherwise the workers' rank 0 hosts their store). node_store_proxy.h.
  bool store_proxy = false;
  // This agent hosts the job's store (node 0, or the owner of the c10d endpoint): after the
  // exit barrier it waits (bounded) until every other agent has left the rendezvous, so their
  // watchers never see the store vanish under them.
  bool hosts_store = false;
  // The status endpoint and timeline (agent_monitor.h). The store server this agent hosts, for
  // its statistics and, for a single node, to publish the endpoint in (null: another agent
  // hosts it); the job token, which control requests must prove. The endpoint is served only
  // when `status_endpoint` is set (main.cc sets it).
  std::shared_ptr<TcpStoreServer> store_server;
  std::optional<std::string> job_token;
  bool status_endpoint = false;
  // The job's flash directory (DLAUNCH_FLASH_DIR for every worker); empty: none.
  std::string flash_dir;
};

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
