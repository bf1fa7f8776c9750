#include "launcher/config/slurm_launch.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "launcher/slurm/slurm_env.h"

namespace dlaunch {
namespace {

// The text of a flag the user gave (on the command line or through its twin), or nullopt.
std::optional<std::string> given(const CliArgs& cli, const EnvLookup& env, const LaunchConfig& cfg,
                                 const std::string& name) {
  auto origin = cfg.origin.find(name);
  if (origin != cfg.origin.end() && origin->second == "default") return std::nullopt;
  if (auto it = cli.values.find(name); it != cli.values.end()) return it->second;
  if (auto v = env(flag_spec(name).env)) return *v;
  return std::nullopt;
}

bool switch_on(const CliArgs& cli, const EnvLookup& env, const std::string& name) {
  if (auto it = cli.values.find(name); it != cli.values.end()) {
    return parse_bool(it->second, "--" + name);
  }
  const std::string& twin = flag_spec(name).env;
  if (auto v = env(twin)) return parse_bool(*v, twin);
  return false;
}

}  // namespace

void apply_slurm(const CliArgs& cli, const EnvLookup& env, LaunchConfig& cfg) {
  UserSettings user;
  user.force_slurm = switch_on(cli, env, "slurm");
  user.no_slurm = switch_on(cli, env, "no_slurm");
  if (!user.no_slurm && cfg.standalone) {
    user.no_slurm = true;
    user.no_slurm_by = "--standalone";
  }
  if (auto it = cli.values.find("slurm_mode"); it != cli.values.end()) {
    user.slurm_mode = it->second;
  } else if (auto v = env(flag_spec("slurm_mode").env)) {
    user.slurm_mode = *v;
  }
  user.nnodes = given(cli, env, cfg, "nnodes");
  user.node_rank = given(cli, env, cfg, "node_rank");
  user.master_addr = given(cli, env, cfg, "master_addr");
  user.master_port = given(cli, env, cfg, "master_port");
  user.rdzv_id = given(cli, env, cfg, "rdzv_id");
  user.nproc_per_node = given(cli, env, cfg, "nproc_per_node");
  if (user.force_slurm && cfg.standalone) {
    throw UsageError(
        "--slurm and --standalone were both given; --standalone runs this node alone, so drop "
        "one of them");
  }

  SlurmSettings s = resolve_slurm_settings(
      read_slurm_env([&env](const std::string& name) { return env(name); }), user);
  cfg.slurm_mode = s.active ? to_string(s.mode) : "off";
  cfg.origin["slurm_mode"] = s.active ? (user.slurm_mode ? "--slurm_mode"
                                                         : "SLURM_STEP_NUM_TASKS "
                                                           "vs nodes (auto)")
                                      : (s.notes.empty() ? "default" : s.notes.front());
  if (!s.active) return;

  if (s.nnodes) {
    int64_t n = parse_int(s.nnodes->value, s.nnodes->source);
    cfg.min_nodes = cfg.max_nodes = n;
    cfg.origin["nnodes"] = s.nnodes->source;
  }
  // A setting Slurm gave takes its value and names its variable as the origin (--print_config).
  auto take = [&cfg](const auto& setting, auto& field, const char* flag) {
    if (!setting) return;
    field = setting->value;
    cfg.origin[flag] = setting->source;
  };
  take(s.node_rank, cfg.node_rank, "node_rank");
  // A hint the elastic rendezvous honours, like --node_rank.
  if (s.node_rank) cfg.node_rank_given = true;
  take(s.master_addr, cfg.master_addr, "master_addr");
  take(s.master_port, cfg.master_port, "master_port");
  take(s.run_id, cfg.run_id, "rdzv_id");
  take(s.nproc_per_node, cfg.nproc_per_node, "nproc_per_node");
}

void exec_slurm_task(const LaunchConfig& cfg) {
  SlurmEnv slurm = read_slurm_env(environ_map());
  if (cfg.master_port == 0) {
    throw UsageError(
        "--master_port=0 cannot work with one Slurm task per worker: no agent runs to pick a "
        "port and tell the others; give a fixed --master_port or leave it unset (derived from "
        "SLURM_JOB_ID)");
  }
  WorkerEnv w = slurm_task_worker_env(slurm, cfg.master_addr, cfg.master_port, cfg.run_id);
  w.role_name = cfg.role;
  for (const auto& [name, value] : w.to_env()) {
    if (setenv(name.c_str(), value.c_str(), 1) != 0) {
      throw SystemError(errno_message("setenv " + name, errno));
    }
  }
  std::vector<std::string> argv = cfg.worker_argv(w.local_rank);
  log_debug("slurm task {}: exec {} as RANK={} LOCAL_RANK={} WORLD_SIZE={}", w.rank, argv[0],
            w.rank, w.local_rank, w.world_size);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  execvp(args[0], args.data());
  throw SystemError(
      errno_message(fmt::format("cannot run '{}' for Slurm task {} (is it on PATH and executable?)",
                                argv[0], w.rank),
                    errno));
}

}  // namespace dlaunch
