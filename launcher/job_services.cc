#include "launcher/job_services.h"

#include <fmt/format.h>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "common/worker_env.h"
#include "rendezvous/tcp_store_server.h"

namespace dlaunch {

JobServices start_job_services(const LaunchConfig& cfg, const std::string& host) {
  JobServices s;
  if (cfg.max_nodes == 1) {
    TcpStoreServerOptions o;
    o.host = cfg.master_addr;
    o.port = static_cast<uint16_t>(cfg.master_port);
    o.token = get_env(env_names::kJobToken);
    auto server = std::make_shared<TcpStoreServer>(o);
    try {
      server->start();
    } catch (const AddressInUseError& e) {
      throw AddressInUseError(fmt::format(
          "cannot host the job's store on {}:{}: the port is in use (another job, or a stale "
          "agent); pass a free --master_port, or --master_port 0 / --standalone to pick one",
          cfg.master_addr, cfg.master_port));
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
  (void)host;
  throw UsageError(fmt::format(
      "--nnodes={}:{} needs the multi-node rendezvous, which this build of dlaunch does not "
      "include yet; run one node (--nnodes 1)",
      cfg.min_nodes, cfg.max_nodes));
}

}  // namespace dlaunch
