#include "worker/train/bootstrap.h"

#include <fmt/format.h>

#include "common/env.h"
#include "common/log.h"
#include "rendezvous/host_port.h"
#include "rendezvous/job_token.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/tcp_store_client.h"
#include "worker/comm/process_group_gloo.h"

namespace dlaunch::train {

std::unique_ptr<comm::ProcessGroup> join_process_group(const WorkerEnv& env,
                                                       std::chrono::seconds timeout) {
  if (env.world_size == 1) return comm::make_local_process_group();
  TcpStoreClientOptions opts;
  opts.host = env.master_addr;
  opts.port = static_cast<uint16_t>(env.master_port);
  opts.connect_timeout = timeout;
  opts.timeout = timeout;
  opts.token = load_job_token();
  auto client = std::make_shared<TcpStoreClient>(opts);
  PrefixStore store(fmt::format("dtrain/attempt_{}", env.restart_count), client);

  comm::GlooOptions gopts;
  gopts.timeout = timeout;
  if (auto iface = get_env("GLOO_SOCKET_IFNAME")) {
    gopts.iface = *iface;
  } else if (env.local_world_size == env.world_size) {
    gopts.hostname = "127.0.0.1";  // one host: loopback
  } else {
    // The address this host reaches the store's host from, which its peers can reach too; the
    // hostname may resolve to loopback (Debian's 127.0.1.1) and break every other host.
    gopts.hostname = local_address_towards(env.master_addr, static_cast<uint16_t>(env.master_port));
  }
  log_debug("joining the gloo group as rank {} of {} via {}:{}", env.rank, env.world_size,
            env.master_addr, env.master_port);
  return comm::make_gloo_process_group(store, static_cast<int>(env.rank),
                                       static_cast<int>(env.world_size), gopts);
}

}  // namespace dlaunch::train
