#include "rendezvous/handlers/static_backend.h"

#include <fmt/format.h>

#include "common/error.h"
#include "rendezvous/handlers/static_rendezvous.h"
#include "rendezvous/tcp/default_ports.h"
#include "rendezvous/tcp/host_port.h"
#include "rendezvous/tcp/store_host.h"
#include "rendezvous/tcp/tcp_store_server.h"

namespace dlaunch {

namespace {

// Node rank 0 hosts the store on the endpoint; it must (nobody else will).
std::unique_ptr<RendezvousHandler> make_static_rendezvous(const RendezvousParams& p) {
  std::shared_ptr<TcpStoreServer> server;
  if (p.host_store && p.node_rank == 0) {
    server = host_job_store(
        parse_host_port(p.endpoint, kDefaultMasterPort, "--rdzv_endpoint"),
        join_timeout_in(p.config), p.token, p.run_id,
        "pass a free --master_port (node 0 publishes it to nobody else, so every node needs the "
        "same value)");
  }
  auto handler = std::make_unique<StaticRendezvous>(p);
  handler->keep_hosted_store(std::move(server));
  return handler;
}

// Port 0 on several nodes: node 0 would pick a port nobody else learns.
void check_static_flags(const BackendFlags& f) {
  if (f.max_nodes > 1 && f.master_port == 0) {
    throw UsageError(fmt::format(
        "{}=0 cannot work with --nnodes={}: the other nodes would not know the port node 0 "
        "picked; give every node the same free --master_port",
        f.master_port_what, f.max_nodes));
  }
  if (f.max_nodes > 1 && !f.endpoint.empty()) {
    parse_host_port(f.endpoint, kDefaultMasterPort, "--rdzv_endpoint");
  }
}

// --rdzv_endpoint when given, else --master_addr:--master_port.
std::string static_endpoint(const BackendFlags& f) {
  HostPort hp = f.endpoint.empty()
                    ? HostPort{f.master_addr, static_cast<uint16_t>(f.master_port)}
                    : parse_host_port(f.endpoint, kDefaultMasterPort, "--rdzv_endpoint");
  return hp.to_string();
}

}  // namespace

RendezvousBackend static_rendezvous_backend() {
  RendezvousBackend b;
  b.name = "static";
  b.default_port = kDefaultMasterPort;
  b.store_hosting = StoreHosting::kNodeRankZero;
  b.elastic = false;
  b.node_rank_required = true;
  b.one_node_without_rendezvous = true;
  // torchrun's static TCP rendezvous reads its rank and a store timeout from --rdzv_conf.
  b.ignored_conf_keys = {"rank", "timeout"};
  b.check_flags = check_static_flags;
  b.resolve_endpoint = static_endpoint;
  b.create = make_static_rendezvous;
  return b;
}

}  // namespace dlaunch
