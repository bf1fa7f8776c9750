// The Slurm glue inside the launcher's config resolution: precedence (explicit flag > DLAUNCH_*
// twin > SLURM_* > default), the origin --dry_run prints, --slurm/--no_slurm/--slurm_mode, and
// --standalone. Pure: the environment is a map.
#include <gtest/gtest.h>

#include <map>

#include "common/error.h"
#include "launcher/config/cli.h"
#include "launcher/config/config_resolution.h"
#include "launcher/config/launch_config.h"

namespace dlaunch {
namespace {

using Env = std::map<std::string, std::string>;

LaunchConfig resolve(std::vector<std::string> args, const Env& env) {
  args.push_back("prog");
  EnvLookup lookup = [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  return resolve_config(parse_cli(args), lookup, HostInfo{8, 0, "feedfacecafebeef"});
}

// `srun -N2 --ntasks-per-node=1`, node 1, job 4242.
Env srun_env() {
  return {{"SLURM_JOB_ID", "4242"},      {"SLURM_STEP_ID", "0"},
          {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_NNODES", "2"},
          {"SLURM_NODEID", "1"},         {"SLURM_STEP_NODELIST", "gpu-[07-08]"},
          {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
          {"SLURM_PROCID", "1"},         {"SLURM_LOCALID", "0"}};
}

TEST(SlurmLaunch, SlurmFillsWhatTheUserLeftAtDefaults) {
  LaunchConfig c = resolve({"--nproc_per_node=2"}, srun_env());
  EXPECT_EQ(c.slurm_mode, "agent");
  EXPECT_EQ(c.min_nodes, 2);
  EXPECT_EQ(c.max_nodes, 2);
  EXPECT_EQ(c.node_rank, 1);
  EXPECT_TRUE(c.node_rank_given);
  EXPECT_EQ(c.master_addr, "gpu-07");
  EXPECT_EQ(c.master_port, 24242);
  EXPECT_EQ(c.run_id, "4242");
  EXPECT_EQ(c.rdzv_backend, "static");
  EXPECT_EQ(c.nproc_per_node, 2);
  EXPECT_EQ(c.origin.at("nnodes"), "SLURM_STEP_NUM_NODES");
  EXPECT_EQ(c.origin.at("node_rank"), "SLURM_NODEID");
  EXPECT_EQ(c.origin.at("master_addr"), "first host of SLURM_STEP_NODELIST");
  EXPECT_EQ(c.origin.at("master_port"), "SLURM_JOB_ID (20000 + 4242 % 10000)");
  EXPECT_EQ(c.origin.at("rdzv_id"), "SLURM_JOB_ID");
  EXPECT_EQ(c.origin.at("nproc_per_node"), "--nproc_per_node");
  EXPECT_NE(c.describe().find("master_port            = 24242"), std::string::npos);
}

TEST(SlurmLaunch, FlagBeatsTwinBeatsSlurm) {
  Env env = srun_env();
  env["DLAUNCH_MASTER_PORT"] = "31000";
  env["DLAUNCH_RDZV_ID"] = "from-twin";
  LaunchConfig c = resolve({"--master_port=32000"}, env);
  EXPECT_EQ(c.master_port, 32000);
  EXPECT_EQ(c.origin.at("master_port"), "--master_port");
  EXPECT_EQ(c.run_id, "from-twin");
  EXPECT_EQ(c.origin.at("rdzv_id"), "DLAUNCH_RDZV_ID");
  EXPECT_EQ(c.master_addr, "gpu-07");  // still Slurm's: neither flag nor twin
}

TEST(SlurmLaunch, ElasticRangeKeepsTheUsersNodesButTakesTheRankHint) {
  LaunchConfig c = resolve({"--nnodes=1:4", "--rdzv_endpoint=h:29400"}, srun_env());
  EXPECT_EQ(c.min_nodes, 1);
  EXPECT_EQ(c.max_nodes, 4);
  EXPECT_EQ(c.rdzv_backend, "c10d");
  EXPECT_EQ(c.node_rank, 1);
  EXPECT_TRUE(c.node_rank_given);
}

TEST(SlurmLaunch, SwitchesAndModes) {
  LaunchConfig off = resolve({"--no_slurm"}, srun_env());
  EXPECT_EQ(off.slurm_mode, "off");
  EXPECT_EQ(off.max_nodes, 1);
  EXPECT_EQ(off.master_port, 0);  // one node without a port: a free one, as torchrun 2.x
  Env twin = srun_env();
  twin["DLAUNCH_NO_SLURM"] = "1";
  EXPECT_EQ(resolve({}, twin).slurm_mode, "off");
  // --standalone means this node alone, whatever Slurm says.
  LaunchConfig alone = resolve({"--standalone"}, srun_env());
  EXPECT_EQ(alone.slurm_mode, "off");
  EXPECT_EQ(alone.max_nodes, 1);
  EXPECT_THROW(resolve({"--standalone", "--slurm"}, srun_env()), UsageError);
  // --slurm outside Slurm fails instead of running one node quietly.
  EXPECT_THROW(resolve({"--slurm"}, {}), UsageError);
  EXPECT_EQ(resolve({}, {}).slurm_mode, "off");
  EXPECT_EQ(resolve({"--slurm_mode=task"}, srun_env()).slurm_mode, "task");
  Env tasks = srun_env();
  tasks["SLURM_STEP_NUM_TASKS"] = "4";
  tasks["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  EXPECT_EQ(resolve({}, tasks).slurm_mode, "task");
  EXPECT_EQ(resolve({}, tasks).origin.at("slurm_mode"), "SLURM_STEP_NUM_TASKS vs nodes (auto)");
  EXPECT_THROW(resolve({"--slurm_mode=both"}, srun_env()), UsageError);
}

TEST(SlurmLaunch, BatchScriptTrapIsAUsageError) {
  Env batch = {{"SLURM_JOB_ID", "7"},
               {"SLURM_JOB_NUM_NODES", "2"},
               {"SLURM_NODEID", "0"},
               {"SLURM_JOB_NODELIST", "n[1-2]"}};
  EXPECT_THROW(resolve({}, batch), UsageError);
  EXPECT_EQ(resolve({"--nnodes=1"}, batch).max_nodes, 1);
}

}  // namespace
}  // namespace dlaunch
