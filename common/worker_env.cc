#include "common/worker_env.h"

#include <fmt/format.h>

#include "common/env.h"
#include "common/error.h"

namespace dlaunch {

std::vector<std::pair<std::string, std::string>> WorkerEnv::to_env() const {
  namespace n = env_names;
  std::vector<std::pair<std::string, std::string>> env = {
      {n::kLocalRank, std::to_string(local_rank)},
      {n::kRank, std::to_string(rank)},
      {n::kGroupRank, std::to_string(group_rank)},
      {n::kRoleRank, std::to_string(role_rank)},
      {n::kRoleName, role_name},
      {n::kLocalWorldSize, std::to_string(local_world_size)},
      {n::kWorldSize, std::to_string(world_size)},
      {n::kGroupWorldSize, std::to_string(group_world_size)},
      {n::kRoleWorldSize, std::to_string(role_world_size)},
      {n::kMasterAddr, master_addr},
      {n::kMasterPort, std::to_string(master_port)},
      {n::kRestartCount, std::to_string(restart_count)},
      {n::kMaxRestarts, std::to_string(max_restarts)},
      {n::kRunId, run_id},
      // Python's str(bool): PyTorch compares against str(True).
      {n::kUseAgentStore, use_agent_store ? "True" : "False"},
      {n::kNodeId, node_id},
      {n::kAttempt, std::to_string(attempt)},
  };
  if (!error_file.empty()) env.emplace_back(n::kErrorFile, error_file);
  if (!omp_num_threads.empty()) env.emplace_back(n::kOmpNumThreads, omp_num_threads);
  if (!heartbeat_file.empty()) env.emplace_back(n::kHeartbeatFile, heartbeat_file);
  if (console_tty) env.emplace_back(n::kConsoleTty, "1");
  if (!flash_dir.empty()) env.emplace_back(n::kFlashDir, flash_dir);
  if (shutdown_grace) env.emplace_back(n::kShutdownGrace, fmt::format("{}", *shutdown_grace));
  if (replacement) env.emplace_back(n::kReplacement, "1");
  return env;
}

bool WorkerEnv::launched() {
  return get_env(env_names::kRank).has_value() && get_env(env_names::kWorldSize).has_value();
}

WorkerEnv WorkerEnv::from_environ() {
  namespace n = env_names;
  WorkerEnv env;
  bool has_rank = get_env(n::kRank).has_value();
  bool has_world = get_env(n::kWorldSize).has_value();
  if (has_rank != has_world) {
    throw UsageError(fmt::format(
        "the launcher contract is incomplete: {} is {} but {} is {}; set both (or neither, to run "
        "as a world of one), or start the program with dlaunch",
        n::kRank, has_rank ? "set" : "unset", n::kWorldSize, has_world ? "set" : "unset"));
  }
  if (!has_rank) return env;
  env.rank = *get_env_int(n::kRank);
  env.world_size = *get_env_int(n::kWorldSize);
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    throw UsageError(fmt::format("{}={} and {}={} are inconsistent: expected 0 <= RANK < WORLD_SIZE",
                                 n::kRank, env.rank, n::kWorldSize, env.world_size));
  }
  env.local_rank = get_env_int(n::kLocalRank).value_or(env.rank);
  env.local_world_size = get_env_int(n::kLocalWorldSize).value_or(env.world_size);
  env.group_rank = get_env_int(n::kGroupRank).value_or(0);
  env.group_world_size = get_env_int(n::kGroupWorldSize).value_or(1);
  env.role_rank = get_env_int(n::kRoleRank).value_or(env.rank);
  env.role_world_size = get_env_int(n::kRoleWorldSize).value_or(env.world_size);
  env.role_name = get_env_or(n::kRoleName, "default");
  env.master_addr = get_env_or(n::kMasterAddr, "127.0.0.1");
  env.master_port = get_env_int(n::kMasterPort).value_or(0);
  env.restart_count = get_env_int(n::kRestartCount).value_or(0);
  env.max_restarts = get_env_int(n::kMaxRestarts).value_or(0);
  env.run_id = get_env_or(n::kRunId, "none");
  env.use_agent_store = get_env_or(n::kUseAgentStore, "False") == "True";
  env.error_file = get_env_or(n::kErrorFile, "");
  env.omp_num_threads = get_env_or(n::kOmpNumThreads, "");
  env.heartbeat_file = get_env_or(n::kHeartbeatFile, "");
  env.console_tty = get_env_or(n::kConsoleTty, "") == "1";
  env.flash_dir = get_env_or(n::kFlashDir, "");
  env.shutdown_grace = get_env_double(n::kShutdownGrace);
  if (env.shutdown_grace && *env.shutdown_grace < 0) {
    throw UsageError(fmt::format("{}={} is negative; expected the seconds a stop signal leaves "
                                 "the worker before SIGKILL (dlaunch sets its --shutdown_grace)",
                                 n::kShutdownGrace, *env.shutdown_grace));
  }
  const std::string replacement = get_env_or(n::kReplacement, "");
  if (!replacement.empty() && replacement != "0" && replacement != "1") {
    throw UsageError(fmt::format(
        "{}={} is not 0 or 1; expected 1 for a worker that replaces a failed rank (set by the "
        "agent), or unset",
        n::kReplacement, replacement));
  }
  env.replacement = replacement == "1";
  env.node_id = get_env_or(n::kNodeId, "");
  env.attempt = get_env_int(n::kAttempt).value_or(env.restart_count);
  return env;
}

}  // namespace dlaunch
