#include "rendezvous/tcp/store_host.h"

#include <fmt/format.h>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/tcp/name_wait.h"
#include "rendezvous/tcp/tcp_store_server.h"

namespace dlaunch {
namespace {

std::shared_ptr<TcpStoreServer> make_server(const HostPort& where,
                                            const std::optional<std::string>& token,
                                            const std::string& run_id) {
  TcpStoreServerOptions o;
  o.run_id = run_id;
  o.host = where.host;
  o.port = where.port;
  o.token = token;
  return std::make_shared<TcpStoreServer>(o);
}

}  // namespace

std::shared_ptr<TcpStoreServer> host_job_store(const HostPort& where, Duration name_patience,
                                               const std::optional<std::string>& token,
                                               const std::string& run_id,
                                               const std::string& in_use_hint) {
  wait_until_name_resolves(where.host, name_patience,
                           "this agent hosts the job's store there, so the name must resolve to "
                           "an address of this machine");
  auto server = make_server(where, token, run_id);
  try {
    server->start();
  } catch (const AddressInUseError&) {
    throw AddressInUseError(fmt::format(
        "cannot host the job's store on {}: the port is in use (another job, or a stale agent); "
        "{}",
        where.to_string(), in_use_hint));
  }
  return server;
}

std::shared_ptr<TcpStoreServer> try_host_job_store(const HostPort& where, Duration name_patience,
                                                   const std::optional<std::string>& token,
                                                   const std::string& run_id) {
  wait_until_name_resolves(where.host, name_patience,
                           "the agent whose address it is hosts the job's store there, and "
                           "every other agent connects to it");
  auto server = make_server(where, token, run_id);
  try {
    server->start();
    return server;
  } catch (const Error& e) {
    log_debug("not hosting the store on {}: {}", where.to_string(), e.what());
    return nullptr;
  }
}

}  // namespace dlaunch
