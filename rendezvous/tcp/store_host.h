// Hosting the job's TCP store: the server an agent starts for the other agents (and PyTorch
// workers) to meet in. Which agent hosts it is each backend's decision, made in its factory
// (rendezvous_registry.cc): static, node rank 0 on the endpoint; c10d, whichever agent binds
// --rdzv_endpoint first (torchrun's rule); etcd, nobody (etcd keeps the rendezvous, and the
// group-rank-0 agent of each round hosts the workers' store: etcd_rendezvous.h).
//
// Blocks to bind, and first while the endpoint's host name does not resolve yet, for up to
// `name_patience` (the join timeout; name_wait.h): a master's name may resolve only once its
// own host is up (a Kubernetes headless service's name), and it is this agent's own name when
// it is the one to host. Throws AddressInUseError (the message says what to do), UsageError
// (not an address of this host), ConnectionError (the name never resolved), SystemError.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "rendezvous/tcp/host_port.h"

namespace dlaunch {

class TcpStoreServer;

// Starts the store of run `run_id` on `where` (port 0: a free one) with `token` (nullopt:
// none); agents of another run are refused (TcpStoreServerOptions::run_id). `in_use_hint` says
// what to do when the port is held ("pass a free --master_port ...").
std::shared_ptr<TcpStoreServer> host_job_store(const HostPort& where, Duration name_patience,
                                               const std::optional<std::string>& token,
                                               const std::string& run_id,
                                               const std::string& in_use_hint);

// The same, but null when this agent cannot bind `where` (the port is held: another agent of
// the job hosts it, or another job's; or the address is not this host's): the agent joins as a
// client, and is refused there if the store serves another run. A name that does not resolve
// yet is waited for first, as above: only then can it tell whether it is this host's.
std::shared_ptr<TcpStoreServer> try_host_job_store(const HostPort& where, Duration name_patience,
                                                   const std::optional<std::string>& token,
                                                   const std::string& run_id);

}  // namespace dlaunch
