// What an agent sets up before its first worker generation: for a single node, the job's TCP
// store; for several nodes, the rendezvous handler, whose backend decides whether this agent
// hosts the store (rendezvous/tcp/store_host.h). Kept apart from the agent so the agent logic stays
// testable with fakes and this wiring stays small.
//
//   single node (--nnodes 1, --standalone): host the store on --master_addr:--master_port
//     (0 = a free port); no rendezvous; workers get TORCHELASTIC_USE_AGENT_STORE=True.
//   static (--nnodes N): node 0 hosts the store on --master_addr:--master_port; every node
//     joins the static rendezvous through it.
//   c10d (--nnodes MIN:MAX): the agent that can bind --rdzv_endpoint hosts the store there
//     (torchrun's rule: try to bind, else be a client); every node joins through it.
//   etcd: no agent hosts the rendezvous' store (etcd is); the group-rank-0 agent of each round
//     hosts the workers' store (rendezvous/etcd/etcd_rendezvous.h).
//
// Blocks only to bind the server. Throws UsageError (bad endpoint/host), AddressInUseError (the
// port is held by another process: the message says what to do), SystemError.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "launcher/config/launch_config.h"

namespace dlaunch {

class TcpStoreServer;
class RendezvousHandler;

struct JobServices {
  std::shared_ptr<TcpStoreServer> server;         // null when another agent hosts the store
  std::shared_ptr<RendezvousHandler> rendezvous;  // null for a single node
  std::string master_addr;  // what single-node workers get as MASTER_ADDR
  int64_t master_port = 0;  // ... and MASTER_PORT
  bool use_agent_store = false;
};

// `version`: this agent's build ("0.1.0+3467aab"), published at rendezvous so a job whose agents
// run different builds warns (rendezvous/handlers/version_mix.h); empty: none.
// What --dry_run says about the address this node must bind: a static job's node 0 (or a
// single node) binds --master_addr (or the static --rdzv_endpoint's host); when that name does
// not resolve now, the run waits for it up to the join timeout (a master's name may resolve
// only once its host is up: rendezvous/tcp/name_wait.h), and this says so. nullopt when it
// resolves. Blocks on one forward lookup; never throws.
std::optional<std::string> store_address_note(const LaunchConfig& cfg);

// The same for --rdzv_backend etcd: a run cannot start when no member of --rdzv_endpoint has a
// host name that resolves. nullopt when one resolves (or might: a lookup that failed only for
// now), or for another backend.
std::optional<std::string> etcd_endpoint_problem(const LaunchConfig& cfg);

JobServices start_job_services(const LaunchConfig& cfg, const std::string& host,
                               const std::string& version = "");

}  // namespace dlaunch
