#include "rendezvous/handlers/c10d_backend.h"

#include <fmt/format.h>

#include "common/error.h"
#include "rendezvous/handlers/dynamic_rendezvous.h"
#include "rendezvous/tcp/default_ports.h"
#include "rendezvous/tcp/host_port.h"
#include "rendezvous/tcp/store_host.h"
#include "rendezvous/tcp/tcp_store_server.h"

namespace dlaunch {

namespace {

// torchrun's rule: the agent that can bind the endpoint hosts the store; the rest connect.
std::unique_ptr<RendezvousHandler> make_c10d_rendezvous(const RendezvousParams& p) {
  std::shared_ptr<TcpStoreServer> server;
  RendezvousParams params = p;
  if (p.host_store) {
    HostPort where = parse_host_port(p.endpoint, kDefaultRendezvousPort, "--rdzv_endpoint");
    server = try_host_job_store(where, join_timeout_in(p.config), p.token, p.run_id);
    // Port 0 (torchrun's --standalone spelling): join the store on the port it was given.
    if (server && where.port == 0) {
      where.port = server->port();
      params.endpoint = where.to_string();
    }
  }
  auto handler = std::make_unique<DynamicRendezvous>(params);
  handler->keep_hosted_store(std::move(server));
  return handler;
}

// Every agent must be told the endpoint, and a port of 0 only works on one node.
void check_c10d_flags(const BackendFlags& f) {
  if (f.endpoint.empty()) {
    throw UsageError(fmt::format(
        "--rdzv_backend=c10d (--nnodes={}:{}) needs --rdzv_endpoint host:port, the address "
        "where one agent hosts the rendezvous store and every other agent connects",
        f.min_nodes, f.max_nodes));
  }
  HostPort hp = parse_host_port(f.endpoint, kDefaultRendezvousPort, "--rdzv_endpoint");
  if (hp.port == 0 && f.max_nodes > 1) {
    throw UsageError(fmt::format(
        "--rdzv_endpoint {} with port 0 cannot work with --nnodes={}:{}: the other nodes "
        "would not know the port this one picked; give every node the same free port",
        f.endpoint, f.min_nodes, f.max_nodes));
  }
}

std::string c10d_endpoint(const BackendFlags& f) {
  return parse_host_port(f.endpoint, kDefaultRendezvousPort, "--rdzv_endpoint").to_string();
}

}  // namespace

RendezvousBackend c10d_rendezvous_backend() {
  RendezvousBackend b;
  b.name = "c10d";
  b.default_port = kDefaultRendezvousPort;
  b.store_hosting = StoreHosting::kFirstToBind;
  // torchrun's c10d backend: which agent hosts, the store's kind and its read timeout.
  b.ignored_conf_keys = {"is_host", "read_timeout", "store_type"};
  b.check_flags = check_c10d_flags;
  b.resolve_endpoint = c10d_endpoint;
  b.create = make_c10d_rendezvous;
  return b;
}

}  // namespace dlaunch
