#include "launcher/config/job_services.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netdb.h>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "common/worker_env.h"
#include "rendezvous/etcd/etcd_endpoints.h"
#include "rendezvous/tcp/host_port.h"
#include "rendezvous/tcp/name_wait.h"
#include "rendezvous/handlers/rendezvous_registry.h"
#include "rendezvous/tcp/store_host.h"
#include "rendezvous/tcp/tcp_store_server.h"

namespace dlaunch {

namespace {

// The resolver's error when `host` surely does not resolve (no such name), else 0 (it does,
// or the lookup failed only for now: a DNS server that did not answer).
int no_such_name(const std::string& host) {
  const int rc = name_lookup_code(host);
  return rc == EAI_NONAME || rc == EAI_NODATA ? rc : 0;
}

}  // namespace

std::optional<std::string> etcd_endpoint_problem(const LaunchConfig& cfg) {
  if (cfg.rdzv_backend != "etcd" || cfg.rdzv_endpoint.empty()) return std::nullopt;
  std::vector<std::string> reasons;
  for (const auto& member : etcd::parse_endpoints(cfg.rdzv_endpoint, "--rdzv_endpoint")) {
    const int rc = no_such_name(member.host);
    if (rc == 0) return std::nullopt;  // the client fails over to any member that resolves
    reasons.push_back(fmt::format("{} ({})", member.host, ::gai_strerror(rc)));
  }
  return fmt::format(
      "--rdzv_endpoint={}: no etcd member's host name resolves: {}; expected the host:port of "
      "etcd's client URL (as `etcdctl --endpoints` takes it): check the name",
      cfg.rdzv_endpoint, fmt::join(reasons, ", "));
}

std::optional<std::string> store_address_note(const LaunchConfig& cfg) {
  const bool binds_store =
      cfg.rdzv_backend == "static" && (cfg.max_nodes == 1 || cfg.node_rank == 0);
  if (!binds_store) return std::nullopt;
  const bool endpoint = cfg.max_nodes > 1 && !cfg.rdzv_endpoint.empty();
  const std::string host = endpoint
                               ? parse_host_port(cfg.rdzv_endpoint, 29500, "--rdzv_endpoint").host
                               : cfg.master_addr;
  const std::string error = name_lookup_error(host);
  if (error.empty()) return std::nullopt;
  return fmt::format(
      "{}={} does not resolve now ({}): this node (node rank 0) hosts the job's store there, so "
      "a run waits for the name up to the join timeout ({:g} s) and then binds the address it "
      "resolves to, which must be this machine's; if the name is misspelt, fix it",
      endpoint ? "--rdzv_endpoint" : "--master_addr", endpoint ? cfg.rdzv_endpoint : host, error,
      to_seconds(join_timeout_in(cfg.rdzv_conf)));
}

JobServices start_job_services(const LaunchConfig& cfg, const std::string& host,
                               const std::string& version) {
  JobServices s;
  if (cfg.max_nodes == 1 && cfg.rdzv_backend == "static") {
    std::shared_ptr<TcpStoreServer> server;
    try {
      server = host_job_store(
          HostPort{cfg.master_addr, static_cast<uint16_t>(cfg.master_port)},
          join_timeout_in(cfg.rdzv_conf), get_env(env_names::kJobToken), cfg.run_id,
          "pass a free --master_port, or --master_port 0 / --standalone to pick one");
    } catch (const UsageError& e) {
      throw UsageError(fmt::format(
          "--master_addr={} cannot host this single-node job's store ({}); use 127.0.0.1 (the "
          "default) or an address of this machine",
          cfg.master_addr, e.what()));
    }
    s.server = server;
    s.master_addr = cfg.master_addr;
    s.master_port = server->port();
    s.use_agent_store = true;
    log_info("hosting the job's store on {}:{} (PyTorch workers join it: "
             "TORCHELASTIC_USE_AGENT_STORE=True)",
             cfg.master_addr, s.master_port);
    return s;
  }

  RendezvousParams p;
  p.backend = cfg.rdzv_backend;
  p.run_id = cfg.run_id;
  p.min_nodes = cfg.min_nodes;
  p.max_nodes = cfg.max_nodes;
  p.local_world_size = cfg.nproc_per_node;
  p.host = cfg.local_addr.empty() ? host : cfg.local_addr;
  p.config = cfg.rdzv_conf;
  p.token = get_env(env_names::kJobToken);
  p.version = version;
  // The endpoints and ports were checked by resolve_config (check_endpoints in
  // launch_config.cc), so a --dry_run refuses what a run would. Whether this agent hosts the
  // store is the backend's decision (rendezvous/tcp/store_host.h).
  p.host_store = true;
  if (cfg.rdzv_backend == "static") {
    HostPort hp = cfg.rdzv_endpoint.empty()
                      ? HostPort{cfg.master_addr, static_cast<uint16_t>(cfg.master_port)}
                      : parse_host_port(cfg.rdzv_endpoint, 29500, "--rdzv_endpoint");
    p.endpoint = hp.to_string();
    p.node_rank = cfg.node_rank;
  } else if (cfg.rdzv_backend == "c10d") {
    p.endpoint = parse_host_port(cfg.rdzv_endpoint, 29400, "--rdzv_endpoint").to_string();
    if (cfg.node_rank_given) p.node_rank = cfg.node_rank;
  } else {
    p.endpoint = cfg.rdzv_endpoint;
    if (cfg.node_rank_given) p.node_rank = cfg.node_rank;
  }
  s.rendezvous = std::shared_ptr<RendezvousHandler>(create_rendezvous_handler(p));
  s.server = s.rendezvous->hosted_store();
  if (s.server) {
    log_info("hosting the job's store on {}:{}", s.server->host(), s.server->port());
  }
  // etcd: the group-rank-0 agent hosts the workers' TCP store each round
  // (rendezvous/etcd/etcd_rendezvous.h), so workers join an agent store there too.
  s.use_agent_store = cfg.rdzv_backend != "etcd-v2";
  return s;
}

}  // namespace dlaunch
