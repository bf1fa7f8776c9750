// Everything an agent offers to watch and steer a running job, kept out of the agent's state
// machine (agent.cc only calls in at a few points):
//   - the job timeline, <run dir>/events.jsonl (job_events.h);
//   - the status endpoint (status_server.h) on --status_addr:--status_port: GET /status (JSON),
//     GET /metrics (Prometheus), GET /events (this node's timeline), and the control endpoints
//     POST /control/stop, /control/restart, /control/dump (what `dlaunch stop|restart|dump`
//     call, job_control.h);
//   - its address, published in the job's store under status/agent/<i> (i from the counter
//     status/agents) so `dlaunch status` finds every agent of the job from the store alone.
//
// Control and the job token: when the job has a token, a control request must carry a proof
// of it, bound to a one-use nonce the agent issued for that action (GET /control/nonce?action=
// stop, 30 s to use it): X-Dlaunch-Nonce (the agent's nonce), X-Dlaunch-Client-Nonce and
// X-Dlaunch-Proof = client_proof(token, client nonce, agent nonce) (rendezvous/tcp/job_token.h),
// all hex. The token never crosses the wire and a captured request cannot be replayed. A
// request without a valid proof gets 403 and a warning in the agent's log. Without a token,
// whoever reaches the endpoint may use it: it binds loopback or the advertised address only.
//
// Threading: everything runs on the agent's loop thread except publishing into another agent's
// store (a helper thread, joined by stop()); a single node publishes into its own store at once.
// Handlers never block the loop: a dump runs the stack tools as processes and answers when they
// end (bounded by the capture timeout).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "launcher/status/job_events.h"
#include "launcher/status/status_keys.h"
#include "launcher/status/node_status.h"
#include "launcher/process/process_context.h"

namespace boost::asio {
class io_context;
}

namespace dlaunch {

class Store;
class TcpStoreServer;
struct AgentOptions;
struct LaunchConfig;

struct MonitorOptions {
  std::string run_id;
  std::string host;
  std::optional<std::string> token;  // the job token; nullopt: none
  int64_t status_port = 0;           // -1: no endpoint; 0: a free port
  std::string status_addr;           // the address to bind
  std::string path_env;              // PATH for finding eu-stack/gdb
  std::string status_command;        // "dlaunch status --master_port 29500 --rdzv_id job7", logged
  Duration stack_capture_timeout = std::chrono::seconds(15);
};

// The options for an agent with this configuration: --status_addr, else --local_addr, else
// the host name for several nodes (the advertised address) and loopback for one; the job token;
// the dlaunch status command that finds this job.
MonitorOptions monitor_options(const LaunchConfig& cfg, const AgentOptions& opts);

enum class ControlAction { kStop, kRestart, kDump };
const char* control_action_name(ControlAction a);

struct ControlAnswer {
  int http_status = 200;  // 200 done/started, 409 refused in this state (message says why)
  std::string message;
};

struct MonitorHooks {
  // The node's status now (loop thread).
  std::function<NodeStatus()> snapshot;
  // Stop or restart, already authorised; `who` names the client for the log and timeline.
  std::function<ControlAnswer(ControlAction action, const std::string& who)> control;
};

class AgentMonitor {
 public:
  AgentMonitor(ProcessContext& procs, boost::asio::io_context& io, MonitorOptions options);
  ~AgentMonitor();  // stop()
  AgentMonitor(const AgentMonitor&) = delete;
  AgentMonitor& operator=(const AgentMonitor&) = delete;

  // Opens <run_dir>/events.jsonl and records agent_started.
  void open_timeline(const std::string& run_dir);
  JobEvents& events() { return events_; }
  const std::string& run_dir() const { return run_dir_; }

  // Starts the endpoint unless --status_port is -1 and logs its address; returns it ("" when
  // off). A port that cannot be bound is logged and the job runs without an endpoint (it is a
  // convenience, not worth failing a job for), unless the port was chosen explicitly: then
  // throws what StatusServer::start throws.
  std::string start_endpoint(MonitorHooks hooks);
  // Publishes the endpoint's address in the job's store (already scoped to the job) on a
  // helper thread, once per agent; `open_store` runs on that thread. Failures are logged.
  void publish(std::function<std::shared_ptr<Store>()> open_store);
  // The same into the store this agent hosts itself, at once, on this thread (a write on the
  // server's thread, microseconds): no client connection, no helper thread. The hosting agent
  // of a rendezvous does this before the round, so `dlaunch status` finds the job while it
  // waits for nodes; publish() then adds nothing.
  void publish_local(TcpStoreServer& server);
  // Stops the endpoint (answers in flight are dropped) and waits for the publisher.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  JobEvents events_;
  std::string run_dir_;
};


}  // namespace dlaunch
