// What the caller (main.cc, a test) gives the agent besides the launch configuration: its clock,
// host, environment, rendezvous and store, and the hooks tests replace. Apart from agent.h so
// the agent's parts can read it without including the agent.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"

namespace dlaunch {

class RendezvousHandler;
class TcpStoreServer;

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

}  // namespace dlaunch
