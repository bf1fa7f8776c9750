// The environment each worker starts with: the agent's own (AgentOptions::base_env) with the
// torchrun contract (common/worker_env.h) on top. Pure functions apart from logging.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/worker_env.h"
#include "launcher/agent/agent.h"
#include "launcher/config/launch_config.h"
#include "rendezvous/handlers/rendezvous_handler.h"

namespace dlaunch {

using EnvPairs = std::vector<std::pair<std::string, std::string>>;

// OMP_NUM_THREADS for every worker, max(1, cores / nproc), logged; "" when the user set it.
std::string default_omp_threads(const LaunchConfig& cfg, const AgentOptions& opts);

// Where this node's workers sit in the round: the global rank of its local rank 0, and the
// world size (nproc_per_node when the round names no sizes).
struct WorkerPlacement {
  int64_t first_rank = 0;
  int64_t world = 0;
};
WorkerPlacement place_workers(const RendezvousResult& r, int64_t nproc_per_node);

// What the environment of one worker is made of, beyond the round.
struct WorkerEnvInputs {
  const LaunchConfig* cfg = nullptr;
  const AgentOptions* opts = nullptr;
  std::string omp_threads;           // "" : the user's own
  bool console_is_terminal = false;  // dlaunch's stdout is a terminal
  int64_t attempt = 0;               // the generation (DLAUNCH_ATTEMPT)
};

// The contract for `local_rank`, whose files live in `rank_dir`.
WorkerEnv worker_contract(const WorkerEnvInputs& in, const RendezvousResult& r,
                          WorkerPlacement place, int64_t local_rank, const std::string& rank_dir);

// `base_env` with the contract on top (contract keys replace inherited ones), plus torchrun's
// NCCL async error handling: TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (2.x's name) and
// NCCL_ASYNC_ERROR_HANDLING=1 (1.x's) when the user set neither.
EnvPairs full_worker_env(const WorkerEnv& contract, const EnvPairs& base_env);

}  // namespace dlaunch
