#include "launcher/agent/worker_environment.h"

#include <algorithm>

#include "common/log.h"

namespace dlaunch {

std::string default_omp_threads(const LaunchConfig& cfg, const AgentOptions& opts) {
  for (const auto& [k, v] : opts.base_env) {
    if (k == env_names::kOmpNumThreads) return "";
  }
  int64_t n = std::max<int64_t>(1, opts.cpus / std::max<int64_t>(1, cfg.nproc_per_node));
  log_info("setting OMP_NUM_THREADS={} for each worker ({} cores / {} workers) to avoid "
           "overloading the node; set OMP_NUM_THREADS yourself to tune it",
           n, opts.cpus, cfg.nproc_per_node);
  return std::to_string(n);
}

WorkerPlacement place_workers(const RendezvousResult& r, int64_t nproc_per_node) {
  WorkerPlacement p;
  for (size_t i = 0; i < r.local_world_sizes.size(); ++i) {
    if (static_cast<int64_t>(i) < r.group_rank) p.first_rank += r.local_world_sizes[i];
    p.world += r.local_world_sizes[i];
  }
  if (p.world == 0) p.world = nproc_per_node;
  return p;
}

WorkerEnv worker_contract(const WorkerEnvInputs& in, const RendezvousResult& r,
                          WorkerPlacement place, int64_t local_rank, const std::string& rank_dir) {
  const LaunchConfig& cfg = *in.cfg;
  WorkerEnv e;
  e.local_rank = local_rank;
  e.rank = place.first_rank + local_rank;
  e.world_size = place.world;
  e.local_world_size = cfg.nproc_per_node;
  e.group_rank = r.group_rank;
  e.group_world_size = r.group_world_size;
  e.role_rank = e.rank;  // one role per job: role ranks are the global ranks
  e.role_world_size = place.world;
  e.role_name = cfg.role;
  e.master_addr = r.master_addr;
  e.master_port = r.master_port;
  e.restart_count = r.restart_count;
  e.max_restarts = cfg.max_restarts;
  e.run_id = cfg.run_id;
  e.use_agent_store = in.opts->use_agent_store;
  e.error_file = rank_dir + "/error.json";
  e.omp_num_threads = in.omp_threads;
  e.heartbeat_file = rank_dir + "/heartbeat";
  e.node_id = in.opts->host;
  e.attempt = in.attempt;
  // Progress bars draw only on a terminal; through dlaunch the worker's stdout is a pipe, so
  // say whether its lines end up on one.
  e.console_tty = in.console_is_terminal && cfg.console_shows(local_rank, 1);
  e.flash_dir = in.opts->flash_dir;
  e.shutdown_grace = to_seconds(cfg.shutdown_grace);
  return e;
}

EnvPairs full_worker_env(const WorkerEnv& contract_env, const EnvPairs& base_env) {
  auto contract = contract_env.to_env();
  EnvPairs env;
  env.reserve(base_env.size() + contract.size() + 2);
  bool has_nccl_async = false;
  for (const auto& kv : base_env) {
    bool overridden = std::any_of(contract.begin(), contract.end(),
                                  [&](const auto& c) { return c.first == kv.first; });
    if (!overridden) env.push_back(kv);
    has_nccl_async |= kv.first == env_names::kNcclAsyncErrorHandling ||
                      kv.first == env_names::kTorchNcclAsyncErrorHandling;
  }
  env.insert(env.end(), contract.begin(), contract.end());
  // torchrun sets it unless the user did, so NCCL errors abort instead of hang: 1.13 under the
  // old name, 2.x under the new one. The worker's PyTorch is not known here, so both; a user
  // who set either chose, and gets neither added (2.x warns that the old name is deprecated,
  // so a 2.x user who minds sets TORCH_NCCL_ASYNC_ERROR_HANDLING).
  if (!has_nccl_async) {
    env.emplace_back(env_names::kTorchNcclAsyncErrorHandling, "1");
    env.emplace_back(env_names::kNcclAsyncErrorHandling, "1");
  }
  return env;
}

}  // namespace dlaunch
