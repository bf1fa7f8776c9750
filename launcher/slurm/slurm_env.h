// What Slurm tells a launched process about its job, read from SLURM_* variables, each value
// with the variable it came from (so --dry_run can say "nnodes=2 (from SLURM_NNODES)").
//
// Two ways to run dlaunch under Slurm (docs/slurm.md has the recipes):
//
//   agent per node:   srun --ntasks-per-node=1 dlaunch --nproc_per_node=2 prog
//     one dlaunch per node; nnodes, node_rank, master_addr, master_port and the run id come
//     from Slurm; dlaunch starts and supervises the workers as without Slurm.
//   task per worker:  srun --ntasks-per-node=2 dlaunch prog
//     Slurm starts every worker itself; dlaunch only turns SLURM_PROCID/SLURM_LOCALID/
//     SLURM_STEP_NUM_TASKS into the torchrun contract (RANK, LOCAL_RANK, WORLD_SIZE, ...) and
//     execs the program (no agent, no store: rank 0's program hosts PyTorch's TCPStore on
//     MASTER_PORT, as with `init_distributed_mode` in the DeiT/DINO seeds).
//   The mode is chosen step-wide, so every node agrees: task per worker when the step runs
//   more tasks than nodes (SLURM_STEP_NUM_TASKS > SLURM_STEP_NUM_NODES: two agents of one
//   job on one node would both claim SLURM_NODEID), agent per node otherwise; --slurm_mode
//   overrides.
//
// Precedence for every setting (resolve_slurm_settings): an explicit flag > its DLAUNCH_* twin
// > the Slurm value > dlaunch's default. The launcher reports which flags and twins the user
// gave; this file never reads the process environment itself except in environ_map().
//
// Pure functions: no I/O, never block. Malformed SLURM_* values throw UsageError naming the
// variable and its value.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/worker_env.h"

namespace dlaunch {

using EnvMap = std::map<std::string, std::string>;
// Looks one variable up (nullopt: unset); the same shape as launch_config.h's EnvLookup.
using EnvGetter = std::function<std::optional<std::string>(const std::string&)>;

// A snapshot of this process's environment (the only impure function here).
EnvMap environ_map();

// A value and the variable it was read (or derived) from.
template <typename T>
struct FromVar {
  T value{};
  std::string source;  // "SLURM_NNODES", "SLURM_JOB_ID (20000 + 1234 % 10000)", ...
};

// The master port a job gets when none is given: kSlurmPortBase + SLURM_JOB_ID % kSlurmPortSpan,
// i.e. 20000..29999: the same on every node of the job without talking, below Linux's ephemeral
// range (32768-60999) so no outgoing connection holds it. Two jobs whose ids differ by a
// multiple of 10000 and whose first nodes coincide collide: pass --master_port then.
inline constexpr int64_t kSlurmPortBase = 20000;
inline constexpr int64_t kSlurmPortSpan = 10000;
int64_t slurm_master_port(int64_t job_id);

// Expands Slurm's compressed counts, "2(x3),1" -> {2, 2, 2, 1} (SLURM_TASKS_PER_NODE,
// SLURM_JOB_CPUS_PER_NODE). `what` names the variable in errors. Throws UsageError.
std::vector<int64_t> expand_slurm_counts(const std::string& text, const std::string& what);

// How many devices CUDA (and so PyTorch) sees through CUDA_VISIBLE_DEVICES, the one rule
// --nproc_per_node gpu|auto and Slurm both use. As CUDA parses it: entries are split at ','
// and trimmed; an index is read like strtoul (its leading digits); GPU-/MIG- UUIDs count as
// given. The list ends at the first entry that is neither ("", "-1", "NoDevFiles": so "0,-1,1"
// is one device and "-1" none), and a device named twice makes CUDA show none at all.
// (PyTorch's torch.cuda._parse_visible_devices models CUDA the same way.) Indices past the
// machine's last GPU are not checked: that needs the driver.
int64_t count_visible_devices(const std::string& list);

enum class SlurmMode { kAgentPerNode, kTaskPerWorker };
const char* to_string(SlurmMode mode);

struct SlurmEnv {
  // SLURM_JOB_ID is set: we run inside a Slurm allocation.
  bool detected = false;
  // SLURM_STEP_ID is set: we run as a task of a job step (srun), not in the batch script or an
  // salloc shell, where only one process runs whatever the node count.
  bool in_step = false;

  std::optional<FromVar<std::string>> job_id;
  std::optional<FromVar<int64_t>> nnodes;           // step's nodes in a step, else the job's
  std::optional<FromVar<int64_t>> node_rank;        // SLURM_NODEID
  std::optional<FromVar<std::string>> nodelist;     // compressed, step's first
  std::optional<FromVar<std::string>> master_addr;  // the nodelist's first host
  std::optional<FromVar<int64_t>> master_port;      // derived from SLURM_JOB_ID
  std::optional<FromVar<std::string>> run_id;       // SLURM_JOB_ID
  // GPUs Slurm gave this node: SLURM_GPUS_ON_NODE, else the count of CUDA_VISIBLE_DEVICES.
  std::optional<FromVar<int64_t>> gpus_on_node;
  std::optional<FromVar<std::string>> node_name;  // SLURMD_NODENAME

  // The step's task layout (task-per-worker mode).
  std::optional<FromVar<int64_t>> procid;       // SLURM_PROCID -> RANK
  std::optional<FromVar<int64_t>> localid;      // SLURM_LOCALID -> LOCAL_RANK
  std::optional<FromVar<int64_t>> ntasks;       // SLURM_STEP_NUM_TASKS / SLURM_NTASKS -> WORLD_SIZE
  std::optional<FromVar<int64_t>> local_tasks;  // this node's entry of SLURM_STEP_TASKS_PER_NODE
  std::optional<FromVar<int64_t>> restart_count;  // SLURM_RESTART_COUNT (requeues so far)

  // Task per worker when the step has more tasks than nodes (see the header comment).
  SlurmMode auto_mode() const;
};

// Reads SLURM_* from `env`. Never throws for a missing variable (the field stays empty);
// throws UsageError for a malformed one (SLURM_NNODES=two, a bad nodelist, SLURM_NODEID
// outside the node count).
SlurmEnv read_slurm_env(const EnvGetter& env);
SlurmEnv read_slurm_env(const EnvMap& env);

// --- Resolution into launch settings -------------------------------------------------------

// What the user gave explicitly (flag or DLAUNCH_* twin); empty optionals mean "not given".
// The launcher fills this from its parsed CLI; values are the raw strings the user wrote.
struct UserSettings {
  std::optional<std::string> nnodes;  // "2" or "1:4"
  std::optional<std::string> node_rank;
  std::optional<std::string> master_addr;
  std::optional<std::string> master_port;
  std::optional<std::string> rdzv_id;
  std::optional<std::string> nproc_per_node;  // "2", "gpu", "auto", "cpu"
  std::optional<std::string> slurm_mode;      // "auto" | "agent" | "task"
  bool force_slurm = false;                   // --slurm: fail if SLURM_* is missing
  bool no_slurm = false;                      // --no_slurm: ignore SLURM_* entirely
  std::string no_slurm_by = "--no_slurm";      // what said so (--standalone implies it)
};

struct SlurmSettings {
  bool active = false;  // Slurm values are in use
  SlurmMode mode = SlurmMode::kAgentPerNode;
  // Values Slurm supplies for settings the user left unset; the launcher applies them before
  // its own defaults. Settings the user gave are not repeated here.
  std::optional<FromVar<std::string>> nnodes;
  std::optional<FromVar<int64_t>> node_rank;
  std::optional<FromVar<std::string>> master_addr;
  std::optional<FromVar<int64_t>> master_port;
  std::optional<FromVar<std::string>> run_id;
  std::optional<FromVar<int64_t>> nproc_per_node;  // only when Slurm knows the GPU count
  // Why Slurm mode is off or partial, for --dry_run ("SLURM_JOB_ID not set").
  std::vector<std::string> notes;
};

// Applies the precedence above. Throws UsageError when --slurm is given outside Slurm, when
// --slurm_mode is not auto/agent/task, and in the batch-script trap: a multi-node job whose
// batch script runs dlaunch directly (not under srun) would wait forever for the other nodes,
// so it fails at once and says to use `srun --ntasks-per-node=1 dlaunch ...` (or --nnodes).
SlurmSettings resolve_slurm_settings(const SlurmEnv& slurm, const UserSettings& user);

// Task-per-worker mode: the torchrun contract for this task. `master_port` and `run_id` are
// the resolved ones (flag or Slurm). Throws UsageError when SLURM_PROCID, SLURM_LOCALID or the
// task counts are missing (not inside srun).
WorkerEnv slurm_task_worker_env(const SlurmEnv& slurm, const std::string& master_addr,
                                int64_t master_port, const std::string& run_id);

}  // namespace dlaunch
