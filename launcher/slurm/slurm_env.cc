#include "launcher/slurm/slurm_env.h"

#include <fmt/format.h>

#include <cctype>
#include <initializer_list>

#include "common/env.h"
#include "common/error.h"
#include "launcher/slurm/hostlist.h"

extern char** environ;

namespace dlaunch {
namespace {

// The first of `names` that is set (and not empty: an empty SLURM_* is a script's mistake,
// never Slurm's), with its name.
std::optional<FromVar<std::string>> first_of(const EnvGetter& env,
                                             std::initializer_list<const char*> names) {
  for (const char* name : names) {
    auto value = env(name);
    if (value && !value->empty()) return FromVar<std::string>{*value, name};
  }
  return std::nullopt;
}

std::optional<FromVar<int64_t>> int_of(const EnvGetter& env,
                                       std::initializer_list<const char*> names,
                                       int64_t min_value) {
  auto text = first_of(env, names);
  if (!text) return std::nullopt;
  int64_t value = parse_int(text->value, text->source);
  if (value < min_value) {
    throw UsageError(
        fmt::format("{}={} is out of range; expected a number >= {} (set by Slurm; "
                    "is the variable overwritten in your job script?)",
                    text->source, text->value, min_value));
  }
  return FromVar<int64_t>{value, text->source};
}

}  // namespace

int64_t count_visible_devices(const std::string& list) {
  std::vector<std::string> seen;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string item =
        list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t b = item.find_first_not_of(" \t");
    size_t e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    std::string device;
    if (item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0) {
      device = item;
    } else {
      // An index reads like strtoul: the leading digits ("1gpu" is device 1, "007" is 7).
      size_t digits = 0;
      while (digits < item.size() && std::isdigit(static_cast<unsigned char>(item[digits]))) {
        ++digits;
      }
      if (digits == 0) break;  // "", "-1", "NoDevFiles": the list ends here
      size_t nz = item.find_first_not_of('0');
      device = nz < digits ? item.substr(nz, digits - nz) : "0";
    }
    for (const auto& d : seen) {
      if (d == device) return 0;  // a device named twice: CUDA shows none
    }
    seen.push_back(device);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return static_cast<int64_t>(seen.size());
}

EnvMap environ_map() {
  EnvMap env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

int64_t slurm_master_port(int64_t job_id) {
  return kSlurmPortBase + (job_id % kSlurmPortSpan + kSlurmPortSpan) % kSlurmPortSpan;
}

std::vector<int64_t> expand_slurm_counts(const std::string& text, const std::string& what) {
  auto bad = [&](const std::string& why) {
    return UsageError(
        fmt::format("{}='{}' is malformed ({}); expected Slurm's form such as "
                    "'2(x3),1'",
                    what, text, why));
  };
  std::vector<int64_t> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int64_t repeat = 1;
    size_t paren = item.find('(');
    std::string count_text = item.substr(0, paren);
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')') {
        throw bad("'" + item + "'");
      }
      repeat = parse_int(item.substr(paren + 2, item.size() - paren - 3), what);
    }
    int64_t count = parse_int(count_text, what);
    if (count < 0 || repeat < 1 || repeat > 1 << 20) throw bad("'" + item + "'");
    out.insert(out.end(), static_cast<size_t>(repeat), count);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.empty()) throw bad("empty");
  return out;
}

const char* to_string(SlurmMode mode) {
  return mode == SlurmMode::kTaskPerWorker ? "task" : "agent";
}

SlurmMode SlurmEnv::auto_mode() const {
  if (in_step && ntasks && nnodes && ntasks->value > nnodes->value) {
    return SlurmMode::kTaskPerWorker;
  }
  return SlurmMode::kAgentPerNode;
}

SlurmEnv read_slurm_env(const EnvMap& env) {
  return read_slurm_env([&env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

SlurmEnv read_slurm_env(const EnvGetter& env) {
  SlurmEnv s;
  s.job_id = first_of(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  s.detected = s.job_id.has_value();
  s.in_step = first_of(env, {"SLURM_STEP_ID", "SLURM_STEPID"}).has_value();

  // srun sets SLURM_NNODES to the step's node count; SLURM_STEP_NUM_NODES says so explicitly.
  s.nnodes = int_of(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, 1);
  s.node_rank = int_of(env, {"SLURM_NODEID"}, 0);
  if (s.node_rank && s.nnodes && s.node_rank->value >= s.nnodes->value) {
    throw UsageError(
        fmt::format("{}={} is not below {}={}: the node rank must be smaller than "
                    "the node count; check what your job script exports",
                    s.node_rank->source, s.node_rank->value, s.nnodes->source, s.nnodes->value));
  }
  s.nodelist = first_of(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (s.nodelist) {
    s.master_addr =
        FromVar<std::string>{first_host(s.nodelist->value), "first host of " + s.nodelist->source};
  }
  if (s.job_id) {
    s.run_id = FromVar<std::string>{s.job_id->value, s.job_id->source};
    // Heterogeneous and array jobs still have a plain numeric SLURM_JOB_ID.
    int64_t id = parse_int(s.job_id->value, s.job_id->source);
    s.master_port = FromVar<int64_t>{
        slurm_master_port(id),
        fmt::format("{} ({} + {} % {})", s.job_id->source, kSlurmPortBase, id, kSlurmPortSpan)};
  }
  s.gpus_on_node = int_of(env, {"SLURM_GPUS_ON_NODE"}, 0);
  if (!s.gpus_on_node) {
    if (auto visible = env("CUDA_VISIBLE_DEVICES")) {
      s.gpus_on_node = FromVar<int64_t>{count_visible_devices(*visible), "CUDA_VISIBLE_DEVICES"};
    }
  }
  s.node_name = first_of(env, {"SLURMD_NODENAME"});

  s.procid = int_of(env, {"SLURM_PROCID"}, 0);
  s.localid = int_of(env, {"SLURM_LOCALID"}, 0);
  s.ntasks = int_of(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}, 1);
  if (auto per_node = first_of(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
      per_node && s.node_rank) {
    auto counts = expand_slurm_counts(per_node->value, per_node->source);
    if (static_cast<size_t>(s.node_rank->value) < counts.size()) {
      s.local_tasks = FromVar<int64_t>{counts[static_cast<size_t>(s.node_rank->value)],
                                       fmt::format("{}[{}]", per_node->source, s.node_rank->value)};
    }
  }
  s.restart_count = int_of(env, {"SLURM_RESTART_COUNT"}, 0);
  return s;
}

SlurmSettings resolve_slurm_settings(const SlurmEnv& slurm, const UserSettings& user) {
  SlurmSettings out;
  if (user.no_slurm) {
    out.notes.push_back("Slurm values ignored (" + user.no_slurm_by + ")");
    return out;
  }
  if (!slurm.detected) {
    if (user.force_slurm) {
      throw UsageError(
          "--slurm was given but SLURM_JOB_ID is not set, so this is not a Slurm job; run dlaunch "
          "under srun or sbatch, or drop --slurm");
    }
    out.notes.push_back("not a Slurm job (SLURM_JOB_ID not set)");
    return out;
  }
  out.active = true;

  const std::string mode = user.slurm_mode.value_or("auto");
  if (mode == "auto") {
    out.mode = slurm.auto_mode();
  } else if (mode == "agent") {
    out.mode = SlurmMode::kAgentPerNode;
  } else if (mode == "task") {
    out.mode = SlurmMode::kTaskPerWorker;
  } else {
    throw UsageError(
        fmt::format("--slurm_mode='{}' is not a mode; expected auto, agent (one "
                    "dlaunch per node) or task (one Slurm task per worker)",
                    mode));
  }
  if (out.mode == SlurmMode::kTaskPerWorker && !slurm.in_step) {
    throw UsageError(
        "--slurm_mode=task needs a job step: start it as `srun --ntasks-per-node=<workers> "
        "dlaunch prog` (SLURM_STEP_ID is not set here, so this is the batch script or an salloc "
        "shell)");
  }

  // The batch-script trap: one process runs the batch script whatever the node count, so an
  // agent here would wait for nodes that never come.
  if (out.mode == SlurmMode::kAgentPerNode && !slurm.in_step && slurm.nnodes &&
      slurm.nnodes->value > 1 && !user.nnodes) {
    throw UsageError(fmt::format(
        "dlaunch runs in the batch script (or salloc shell) of a {}-node job ({}={}), not in a "
        "job step, so it would wait forever for the other {} nodes; start one dlaunch per node "
        "with `srun --ntasks-per-node=1 dlaunch ...`, or pass --nnodes=1 to use this node only",
        slurm.nnodes->value, slurm.nnodes->source, slurm.nnodes->value, slurm.nnodes->value - 1));
  }

  if (slurm.nnodes && !user.nnodes) {
    out.nnodes = FromVar<std::string>{std::to_string(slurm.nnodes->value), slurm.nnodes->source};
  }
  if (slurm.node_rank && !user.node_rank) out.node_rank = slurm.node_rank;
  if (slurm.master_addr && !user.master_addr) out.master_addr = slurm.master_addr;
  if (slurm.master_port && !user.master_port) out.master_port = slurm.master_port;
  if (slurm.run_id && !user.rdzv_id) out.run_id = slurm.run_id;

  if (out.mode == SlurmMode::kAgentPerNode) {
    // Default: one worker per GPU Slurm gave this node (--gpus-per-node / --gres=gpu:N). For
    // an explicit "gpu"/"auto", CUDA_VISIBLE_DEVICES counts too.
    const bool wants_gpus =
        user.nproc_per_node && (*user.nproc_per_node == "gpu" || *user.nproc_per_node == "auto");
    if (slurm.gpus_on_node && slurm.gpus_on_node->value > 0) {
      if (wants_gpus ||
          (!user.nproc_per_node && slurm.gpus_on_node->source == "SLURM_GPUS_ON_NODE")) {
        out.nproc_per_node = slurm.gpus_on_node;
      }
    }
  }
  return out;
}

WorkerEnv slurm_task_worker_env(const SlurmEnv& slurm, const std::string& master_addr,
                                int64_t master_port, const std::string& run_id) {
  auto need = [](const auto& field, const char* what) {
    if (!field) {
      throw UsageError(fmt::format(
          "one task per worker needs {} from Slurm, which is not set; start the workers with "
          "`srun --ntasks-per-node=<workers> dlaunch prog`",
          what));
    }
    return field->value;
  };
  WorkerEnv w;
  w.rank = need(slurm.procid, "SLURM_PROCID");
  w.local_rank = need(slurm.localid, "SLURM_LOCALID");
  w.world_size = need(slurm.ntasks, "SLURM_STEP_NUM_TASKS (or SLURM_NTASKS)");
  w.local_world_size = need(slurm.local_tasks, "SLURM_STEP_TASKS_PER_NODE");
  w.group_rank = need(slurm.node_rank, "SLURM_NODEID");
  w.group_world_size = need(slurm.nnodes, "SLURM_STEP_NUM_NODES (or SLURM_NNODES)");
  if (w.rank >= w.world_size || w.local_rank >= w.local_world_size) {
    throw UsageError(fmt::format(
        "Slurm's task layout is inconsistent: SLURM_PROCID={} with {} tasks, SLURM_LOCALID={} "
        "with {} tasks on this node; check what your job script exports",
        w.rank, w.world_size, w.local_rank, w.local_world_size));
  }
  w.role_rank = w.rank;
  w.role_world_size = w.world_size;
  w.master_addr = master_addr;
  w.master_port = master_port;
  w.run_id = run_id;
  // A requeued job counts as a restart, so a script that resumes on restart does so here too.
  w.restart_count = slurm.restart_count ? slurm.restart_count->value : 0;
  w.max_restarts = 0;
  // No agent runs: rank 0's program hosts the store itself (PyTorch's env:// does).
  w.use_agent_store = false;
  w.node_id = slurm.node_name ? slurm.node_name->value : "";
  return w;
}

}  // namespace dlaunch
