// The worker environment contract: every variable dlaunch sets for a worker, in one place.
// The launcher fills a WorkerEnv and calls to_env(); workers (dtrain, test workers) call
// WorkerEnv::from_environ(). docs/env.md is this header's user-facing twin: change both.
//
// The torchrun variables carry torchrun's values for the same job, byte for byte (booleans as
// Python's str(True) = "True"), so unmodified PyTorch scripts work.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dlaunch {

namespace env_names {
// torchrun's set.
inline constexpr const char kRank[] = "RANK";
inline constexpr const char kLocalRank[] = "LOCAL_RANK";
inline constexpr const char kWorldSize[] = "WORLD_SIZE";
inline constexpr const char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr const char kGroupRank[] = "GROUP_RANK";
inline constexpr const char kGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr const char kRoleRank[] = "ROLE_RANK";
inline constexpr const char kRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr const char kRoleName[] = "ROLE_NAME";
inline constexpr const char kMasterAddr[] = "MASTER_ADDR";
inline constexpr const char kMasterPort[] = "MASTER_PORT";
inline constexpr const char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char kMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr const char kRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr const char kUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr const char kErrorFile[] = "TORCHELASTIC_ERROR_FILE";
inline constexpr const char kOmpNumThreads[] = "OMP_NUM_THREADS";
// PyTorch 1.x's name, and 2.x's.
inline constexpr const char kNcclAsyncErrorHandling[] = "NCCL_ASYNC_ERROR_HANDLING";
inline constexpr const char kTorchNcclAsyncErrorHandling[] = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
// dlaunch's extras.
inline constexpr const char kHeartbeatFile[] = "DLAUNCH_HEARTBEAT_FILE";
inline constexpr const char kNodeId[] = "DLAUNCH_NODE_ID";
inline constexpr const char kAttempt[] = "DLAUNCH_ATTEMPT";
inline constexpr const char kJobToken[] = "DLAUNCH_JOB_TOKEN";
// "1" when the worker's stdout reaches a terminal through dlaunch (its own stdout is a pipe).
inline constexpr const char kConsoleTty[] = "DLAUNCH_CONSOLE_TTY";
// The job's memory-backed directory, kept by the agent across worker restarts (flash_dir.h).
inline constexpr const char kFlashDir[] = "DLAUNCH_FLASH_DIR";
// The agent's --shutdown_grace in seconds: how long a stop signal leaves the worker before
// SIGKILL (dtrain's stop watchdog gives up on a blocked step within it). Also the flag's twin.
inline constexpr const char kShutdownGrace[] = "DLAUNCH_SHUTDOWN_GRACE";
// "1": this worker replaces a failed rank of a job whose other ranks kept running; it takes the
// training state from a surviving rank instead of a checkpoint (dtrain: worker/train/peer_state.h).
// Set only for a worker that opted in; not set by today's agent (it restarts the whole group).
inline constexpr const char kReplacement[] = "DLAUNCH_REPLACEMENT";
// The store key of this worker group's generation counter, set (at every spawn) only when the
// agent replaces single ranks in process (--restart_scope rank). Value:
// dlaunch/recovery/<run_id>/attempt_<restart_count>; a worker that opted in
// (common/rank_recovery.h) re-forms its group at each generation the agent announces there.
inline constexpr const char kRecoveryKey[] = "DLAUNCH_RECOVERY_KEY";
}  // namespace env_names

struct WorkerEnv {
  int64_t rank = 0;
  int64_t local_rank = 0;
  int64_t world_size = 1;
  int64_t local_world_size = 1;
  int64_t group_rank = 0;        // the node's rank
  int64_t group_world_size = 1;  // the number of nodes
  int64_t role_rank = 0;
  int64_t role_world_size = 1;
  std::string role_name = "default";
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 0;
  int64_t restart_count = 0;
  int64_t max_restarts = 0;
  std::string run_id = "none";
  bool use_agent_store = true;
  std::string error_file;      // empty: not set
  std::string omp_num_threads;  // empty: not set by dlaunch (the user's value is inherited)
  std::string heartbeat_file;  // empty: not set
  std::string node_id;
  int64_t attempt = 0;
  bool console_tty = false;  // set as DLAUNCH_CONSOLE_TTY=1 only when true
  std::string flash_dir;     // empty: not set (--flash_limit 0, or not under dlaunch)
  std::optional<double> shutdown_grace;  // seconds; none: not set (not under dlaunch)
  bool replacement = false;              // set as DLAUNCH_REPLACEMENT=1 only when true

  // The variables in a fixed order, ready for execve. Empty optional fields are left out.
  std::vector<std::pair<std::string, std::string>> to_env() const;

  // Reads the contract from this process's environment. When RANK is unset the process was not
  // started by a launcher and gets a world of one; a partial contract (RANK without WORLD_SIZE,
  // a rank outside the world) throws UsageError naming the variables.
  static WorkerEnv from_environ();

  // True when this process was started by a launcher (RANK and WORLD_SIZE are set).
  static bool launched();
};

}  // namespace dlaunch
