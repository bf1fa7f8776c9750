#include "worker/train/bootstrap.h"

#include <fmt/format.h>

#include "common/env.h"
#include "common/error.h"
#include "common/plugin.h"
#include "common/log.h"
#include "rendezvous/tcp/host_port.h"
#include "rendezvous/tcp/job_token.h"
#include "rendezvous/store/prefix_store.h"
#include "rendezvous/tcp/tcp_store_client.h"
#include "worker/comm/nccl_plugin.h"
#include "worker/comm/process_group_gloo.h"

namespace dlaunch::train {

namespace {

// The NCCL plugin's group factory, or null with the reason why not (said as "found ...").
DlaunchNcclMakeGroupFn nccl_factory(std::string* why) {
  static const LoadedPlugin plugin = load_plugin("libdlaunch_nccl.so", "DLAUNCH_NCCL_PLUGIN");
  if (plugin.path.empty()) {
    *why = "found no NCCL plugin (libdlaunch_nccl.so beside dtrain)";
    return nullptr;
  }
  if (plugin.handle == nullptr) {
    *why = fmt::format("found {}, which did not load: {}", plugin.path, plugin.load_error);
    return nullptr;
  }
  auto abi = reinterpret_cast<DlaunchNcclAbiFn>(plugin.symbol("dlaunch_nccl_plugin_abi"));
  auto make = reinterpret_cast<DlaunchNcclMakeGroupFn>(plugin.symbol("dlaunch_nccl_make_group"));
  if (abi == nullptr || make == nullptr || abi() != kNcclPluginAbi) {
    *why = fmt::format("found {}, which is not this build's NCCL plugin", plugin.path);
    return nullptr;
  }
  return make;
}

// Every rank's vote: NCCL only when every rank can (each on a GPU of its own, the plugin loaded).
// Each rank adds its vote before counting itself in, and the last one in marks the count
// complete, so the others wait on one key (Store::wait: TimeoutError after `timeout`) instead of
// polling the store.
bool all_ranks_can_use_nccl(Store& store, bool mine, int64_t world, std::chrono::milliseconds timeout) {
  if (mine) store.add("nccl_votes", 1);
  if (store.add("transport_votes", 1) == world) store.set("transport_voted", Bytes{1});
  store.wait({"transport_voted"}, timeout);
  return store.add("nccl_votes", 0) == world;
}

}  // namespace

std::shared_ptr<Store> connect_job_store(const WorkerEnv& env, std::chrono::milliseconds timeout) {
  TcpStoreClientOptions opts;
  opts.host = env.master_addr;
  opts.port = static_cast<uint16_t>(env.master_port);
  opts.connect_timeout = timeout;
  opts.timeout = timeout;
  opts.token = load_job_token();
  return std::make_shared<TcpStoreClient>(opts);
}

std::unique_ptr<comm::ProcessGroup> join_process_group(const WorkerEnv& env,
                                                       std::chrono::milliseconds timeout,
                                                       std::chrono::milliseconds collective_timeout,
                                                       const kernels::OpenedDevice& device,
                                                       int64_t generation,
                                                       std::shared_ptr<Store> client) {
  if (env.world_size == 1) return comm::make_local_process_group();
  std::string prefix = fmt::format("dtrain/attempt_{}", env.restart_count);
  if (generation > 0) prefix += fmt::format("/gen_{}", generation);
  PrefixStore store(prefix, client ? std::move(client) : connect_job_store(env, timeout));

  // Every rank votes, CPU ranks too (a node whose --device auto found no GPU), so that all take
  // the same transport. NCCL refuses two ranks on one GPU: ranks sharing one take gloo.
  std::string why;
  DlaunchNcclMakeGroupFn make = nullptr;
  if (device.cuda_device < 0) {
    why = "this rank computes on the CPU";
  } else if (env.local_world_size > device.cuda_visible) {
    why = fmt::format("{} local workers share {} visible GPU(s)", env.local_world_size,
                      device.cuda_visible);
  } else {
    make = nccl_factory(&why);
  }
  if (all_ranks_can_use_nccl(store, make != nullptr, env.world_size, timeout)) {
    log_debug("joining the NCCL group as rank {} of {} on GPU {}", env.rank, env.world_size,
              device.cuda_device);
    char err[1024] = {};
    comm::ProcessGroup* pg =
        make(&store, static_cast<int>(env.rank), static_cast<int>(env.world_size),
             device.cuda_device, collective_timeout.count(), timeout.count(), err, sizeof err);
    if (pg == nullptr) throw ConnectionError(fmt::format("NCCL group: {}", err));
    return std::unique_ptr<comm::ProcessGroup>(pg);
  }
  if (device.cuda_device >= 0) {
    log_info("gradients and SyncBN go through the host (gloo): {}",
             make != nullptr ? std::string("another rank cannot use NCCL") : why);
  }

  comm::GlooOptions gopts;
  gopts.connect_timeout = timeout;
  gopts.timeout = collective_timeout;
  if (auto iface = get_env("GLOO_SOCKET_IFNAME")) {
    gopts.iface = *iface;
  } else if (env.local_world_size == env.world_size) {
    gopts.hostname = "127.0.0.1";  // one host: loopback
  } else {
    // The address this host reaches the store's host from, which its peers can reach too; the
    // hostname may resolve to loopback (Debian's 127.0.1.1) and break every other host.
    gopts.hostname = local_address_towards(env.master_addr, static_cast<uint16_t>(env.master_port));
  }
  log_debug("joining the gloo group as rank {} of {} via {}:{} (generation {})", env.rank,
            env.world_size, env.master_addr, env.master_port, generation);
  return comm::make_gloo_process_group(store, static_cast<int>(env.rank),
                                       static_cast<int>(env.world_size), gopts);
}

}  // namespace dlaunch::train
