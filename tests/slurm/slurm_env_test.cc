#include "launcher/slurm/slurm_env.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlaunch {
namespace {

// The variables a real `srun -N2 --ntasks-per-node=1` task saw on node 1 of the test cluster
// (tests/cluster/start_slurm.sh), trimmed to what dlaunch reads plus a few it must ignore.
EnvMap srun_agent_env() {
  return {
      {"SLURMD_NODENAME", "127.0.0.12"},
      {"SLURM_JOBID", "1"},
      {"SLURM_JOB_ID", "1"},
      {"SLURM_JOB_NODELIST", "127.0.0.[11-12]"},
      {"SLURM_JOB_NUM_NODES", "2"},
      {"SLURM_LOCALID", "0"},
      {"SLURM_NNODES", "2"},
      {"SLURM_NODEID", "1"},
      {"SLURM_NODELIST", "127.0.0.[11-12]"},
      {"SLURM_NPROCS", "2"},
      {"SLURM_NTASKS", "2"},
      {"SLURM_NTASKS_PER_NODE", "1"},
      {"SLURM_PROCID", "1"},
      {"SLURM_STEPID", "0"},
      {"SLURM_STEP_ID", "0"},
      {"SLURM_STEP_NODELIST", "127.0.0.[11-12]"},
      {"SLURM_STEP_NUM_NODES", "2"},
      {"SLURM_STEP_NUM_TASKS", "2"},
      {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
      {"SLURM_TASKS_PER_NODE", "1(x2)"},
  };
}

// `srun --ntasks-per-node=2` inside a 2-node batch job, task 3 (node 1, local 1).
EnvMap srun_task_env() {
  return {
      {"SLURMD_NODENAME", "127.0.0.12"},
      {"SLURM_JOB_ID", "4"},
      {"SLURM_JOB_NODELIST", "127.0.0.[11-12]"},
      {"SLURM_JOB_NUM_NODES", "2"},
      {"SLURM_LOCALID", "1"},
      {"SLURM_NNODES", "2"},
      {"SLURM_NODEID", "1"},
      {"SLURM_NTASKS", "4"},
      {"SLURM_PROCID", "3"},
      {"SLURM_STEP_ID", "0"},
      {"SLURM_STEP_NODELIST", "127.0.0.[11-12]"},
      {"SLURM_STEP_NUM_NODES", "2"},
      {"SLURM_STEP_NUM_TASKS", "4"},
      {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
      {"SLURM_TASKS_PER_NODE", "2(x2)"},
  };
}

// The batch script of a 2-node job: no step, SLURM_NODEID=0 on the first node only.
EnvMap batch_env() {
  return {
      {"SLURM_JOB_ID", "3"},
      {"SLURM_JOB_NODELIST", "127.0.0.[11-12]"},
      {"SLURM_JOB_NUM_NODES", "2"},
      {"SLURM_NNODES", "2"},
      {"SLURM_NODEID", "0"},
      {"SLURM_PROCID", "0"},
      {"SLURM_TASKS_PER_NODE", "1(x2)"},
  };
}

TEST(SlurmEnv, NotASlurmJob) {
  SlurmEnv s = read_slurm_env(EnvMap{{"PATH", "/usr/bin"}});
  EXPECT_FALSE(s.detected);
  EXPECT_FALSE(s.nnodes);
  EXPECT_FALSE(s.master_port);
  SlurmSettings out = resolve_slurm_settings(s, {});
  EXPECT_FALSE(out.active);
  ASSERT_EQ(out.notes.size(), 1u);
  EXPECT_NE(out.notes[0].find("SLURM_JOB_ID not set"), std::string::npos);
  UserSettings forced;
  forced.force_slurm = true;
  EXPECT_THROW(resolve_slurm_settings(s, forced), UsageError);
}

TEST(SlurmEnv, AgentPerNodeStepValuesAndSources) {
  SlurmEnv s = read_slurm_env(srun_agent_env());
  EXPECT_TRUE(s.detected);
  EXPECT_TRUE(s.in_step);
  ASSERT_TRUE(s.nnodes);
  EXPECT_EQ(s.nnodes->value, 2);
  EXPECT_EQ(s.nnodes->source, "SLURM_STEP_NUM_NODES");
  EXPECT_EQ(s.node_rank->value, 1);
  EXPECT_EQ(s.node_rank->source, "SLURM_NODEID");
  EXPECT_EQ(s.master_addr->value, "127.0.0.11");
  EXPECT_EQ(s.master_addr->source, "first host of SLURM_STEP_NODELIST");
  EXPECT_EQ(s.master_port->value, 20001);
  EXPECT_EQ(s.master_port->source, "SLURM_JOB_ID (20000 + 1 % 10000)");
  EXPECT_EQ(s.run_id->value, "1");
  EXPECT_EQ(s.node_name->value, "127.0.0.12");
  EXPECT_EQ(s.local_tasks->value, 1);
  EXPECT_EQ(s.auto_mode(), SlurmMode::kAgentPerNode);

  SlurmSettings out = resolve_slurm_settings(s, {});
  EXPECT_TRUE(out.active);
  EXPECT_EQ(out.mode, SlurmMode::kAgentPerNode);
  EXPECT_EQ(out.nnodes->value, "2");
  EXPECT_EQ(out.node_rank->value, 1);
  EXPECT_EQ(out.master_addr->value, "127.0.0.11");
  EXPECT_EQ(out.master_port->value, 20001);
  EXPECT_EQ(out.run_id->value, "1");
  EXPECT_FALSE(out.nproc_per_node);  // no GPUs from Slurm: the launcher's default stands
}

TEST(SlurmEnv, FallsBackToJobVariables) {
  EnvMap env = {{"SLURM_JOB_ID", "12345"},
                {"SLURM_JOB_NUM_NODES", "3"},
                {"SLURM_JOB_NODELIST", "gpu-[01-02,07]"},
                {"SLURM_NODEID", "2"},
                {"SLURM_STEP_ID", "0"}};
  SlurmEnv s = read_slurm_env(env);
  EXPECT_EQ(s.nnodes->source, "SLURM_JOB_NUM_NODES");
  EXPECT_EQ(s.master_addr->value, "gpu-01");
  EXPECT_EQ(s.master_addr->source, "first host of SLURM_JOB_NODELIST");
  EXPECT_EQ(s.master_port->value, 22345);
  // The step's list wins over the job's: a step may run on a subset of the job's nodes.
  env["SLURM_STEP_NODELIST"] = "gpu-07";
  env["SLURM_NNODES"] = "1";
  env["SLURM_NODEID"] = "0";
  s = read_slurm_env(env);
  EXPECT_EQ(s.master_addr->value, "gpu-07");
  EXPECT_EQ(s.nnodes->value, 1);
  EXPECT_EQ(s.nnodes->source, "SLURM_NNODES");
}

TEST(SlurmEnv, MasterPortFormula) {
  EXPECT_EQ(slurm_master_port(0), 20000);
  EXPECT_EQ(slurm_master_port(9999), 29999);
  EXPECT_EQ(slurm_master_port(10000), 20000);
  EXPECT_EQ(slurm_master_port(4242424), 22424);
  for (int64_t id : {1, 77, 123456789}) {
    EXPECT_GE(slurm_master_port(id), 20000);
    EXPECT_LT(slurm_master_port(id), 32768);  // below Linux's ephemeral range
  }
}

TEST(SlurmEnv, ExplicitSettingsWin) {
  SlurmEnv s = read_slurm_env(srun_agent_env());
  UserSettings user;
  user.nnodes = "1:4";
  user.node_rank = "0";
  user.master_addr = "10.0.0.1";
  user.master_port = "29500";
  user.rdzv_id = "myjob";
  SlurmSettings out = resolve_slurm_settings(s, user);
  EXPECT_TRUE(out.active);
  EXPECT_FALSE(out.nnodes);
  EXPECT_FALSE(out.node_rank);
  EXPECT_FALSE(out.master_addr);
  EXPECT_FALSE(out.master_port);
  EXPECT_FALSE(out.run_id);
  user.no_slurm = true;
  EXPECT_FALSE(resolve_slurm_settings(s, user).active);
}

TEST(SlurmEnv, GpusFromSlurm) {
  EnvMap env = srun_agent_env();
  env["SLURM_GPUS_ON_NODE"] = "4";
  env["CUDA_VISIBLE_DEVICES"] = "0,1,2,3";
  SlurmEnv s = read_slurm_env(env);
  EXPECT_EQ(s.gpus_on_node->value, 4);
  EXPECT_EQ(s.gpus_on_node->source, "SLURM_GPUS_ON_NODE");
  SlurmSettings out = resolve_slurm_settings(s, {});
  ASSERT_TRUE(out.nproc_per_node);
  EXPECT_EQ(out.nproc_per_node->value, 4);
  UserSettings user;
  user.nproc_per_node = "2";
  EXPECT_FALSE(resolve_slurm_settings(s, user).nproc_per_node);
  user.nproc_per_node = "gpu";
  EXPECT_EQ(resolve_slurm_settings(s, user).nproc_per_node->value, 4);

  // CUDA_VISIBLE_DEVICES alone answers "gpu"/"auto" but does not change the default: a user's
  // own CUDA_VISIBLE_DEVICES is no request for one worker per device.
  env.erase("SLURM_GPUS_ON_NODE");
  env["CUDA_VISIBLE_DEVICES"] = "GPU-aaaa,GPU-bbbb,MIG-cccc";
  s = read_slurm_env(env);
  EXPECT_EQ(s.gpus_on_node->value, 3);
  EXPECT_EQ(s.gpus_on_node->source, "CUDA_VISIBLE_DEVICES");
  EXPECT_FALSE(resolve_slurm_settings(s, {}).nproc_per_node);
  user.nproc_per_node = "auto";
  EXPECT_EQ(resolve_slurm_settings(s, user).nproc_per_node->value, 3);
  // CUDA stops at the first invalid entry; "" and "-1" hide everything.
  env["CUDA_VISIBLE_DEVICES"] = "0,1,-1,2";
  EXPECT_EQ(read_slurm_env(env).gpus_on_node->value, 2);
  env["CUDA_VISIBLE_DEVICES"] = "";
  EXPECT_EQ(read_slurm_env(env).gpus_on_node->value, 0);
  env["CUDA_VISIBLE_DEVICES"] = "-1";
  EXPECT_EQ(read_slurm_env(env).gpus_on_node->value, 0);
}

// The one counting rule, shared with --nproc_per_node gpu|auto (launch_config.cc).
TEST(SlurmEnv, VisibleDevicesAreCountedAsCudaCountsThem) {
  EXPECT_EQ(count_visible_devices("0,1,2,3"), 4);
  EXPECT_EQ(count_visible_devices("-1"), 0);
  EXPECT_EQ(count_visible_devices("0,-1,1"), 1);
  EXPECT_EQ(count_visible_devices("NoDevFiles"), 0);
  EXPECT_EQ(count_visible_devices(""), 0);
  EXPECT_EQ(count_visible_devices("0,,1"), 1);
  EXPECT_EQ(count_visible_devices(" 2 , 3 "), 2);
  EXPECT_EQ(count_visible_devices("1gpu,2x"), 2);  // read like strtoul
  EXPECT_EQ(count_visible_devices("0,1,01"), 0);   // device 1 twice: CUDA shows none
  EXPECT_EQ(count_visible_devices("GPU-aaaa,GPU-aaaa"), 0);
  EXPECT_EQ(count_visible_devices("GPU-aaaa,MIG-bbbb,oops,GPU-cccc"), 2);
}

TEST(SlurmEnv, BatchScriptOfAMultiNodeJobIsRefused) {
  SlurmEnv s = read_slurm_env(batch_env());
  EXPECT_TRUE(s.detected);
  EXPECT_FALSE(s.in_step);
  try {
    resolve_slurm_settings(s, {});
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("2-node job"), std::string::npos) << msg;
    EXPECT_NE(msg.find("srun --ntasks-per-node=1 dlaunch"), std::string::npos) << msg;
  }
  // With an explicit --nnodes the user decided; a 1-node batch job is fine as is.
  UserSettings user;
  user.nnodes = "1";
  EXPECT_TRUE(resolve_slurm_settings(s, user).active);
  EnvMap one = batch_env();
  one["SLURM_JOB_NUM_NODES"] = "1";
  one["SLURM_NNODES"] = "1";
  EXPECT_EQ(resolve_slurm_settings(read_slurm_env(one), {}).nnodes->value, "1");
}

TEST(SlurmEnv, TaskPerWorkerIsChosenStepWide) {
  SlurmEnv s = read_slurm_env(srun_task_env());
  EXPECT_EQ(s.auto_mode(), SlurmMode::kTaskPerWorker);
  EXPECT_EQ(resolve_slurm_settings(s, {}).mode, SlurmMode::kTaskPerWorker);
  // An uneven step (3 tasks on 2 nodes) is task-per-worker on every node, including the one
  // that runs a single task.
  EnvMap uneven = srun_task_env();
  uneven["SLURM_STEP_NUM_TASKS"] = "3";
  uneven["SLURM_STEP_TASKS_PER_NODE"] = "2,1";
  uneven["SLURM_PROCID"] = "2";
  uneven["SLURM_LOCALID"] = "0";
  SlurmEnv u = read_slurm_env(uneven);
  EXPECT_EQ(u.local_tasks->value, 1);
  EXPECT_EQ(u.auto_mode(), SlurmMode::kTaskPerWorker);

  UserSettings user;
  user.slurm_mode = "agent";
  EXPECT_EQ(resolve_slurm_settings(s, user).mode, SlurmMode::kAgentPerNode);
  user.slurm_mode = "task";
  EXPECT_EQ(resolve_slurm_settings(read_slurm_env(srun_agent_env()), user).mode,
            SlurmMode::kTaskPerWorker);
  user.slurm_mode = "tasks";
  EXPECT_THROW(resolve_slurm_settings(s, user), UsageError);
  user.slurm_mode = "task";
  EXPECT_THROW(resolve_slurm_settings(read_slurm_env(batch_env()), user), UsageError);
}

TEST(SlurmEnv, TaskWorkerEnvFollowsSlurmIds) {
  SlurmEnv s = read_slurm_env(srun_task_env());
  WorkerEnv w =
      slurm_task_worker_env(s, s.master_addr->value, s.master_port->value, s.run_id->value);
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.world_size, 4);
  EXPECT_EQ(w.local_world_size, 2);
  EXPECT_EQ(w.group_rank, 1);
  EXPECT_EQ(w.group_world_size, 2);
  EXPECT_EQ(w.role_rank, 3);
  EXPECT_EQ(w.role_world_size, 4);
  EXPECT_EQ(w.master_addr, "127.0.0.11");
  EXPECT_EQ(w.master_port, 20004);
  EXPECT_EQ(w.run_id, "4");
  EXPECT_FALSE(w.use_agent_store);
  EXPECT_EQ(w.restart_count, 0);
  EXPECT_EQ(w.node_id, "127.0.0.12");

  EnvMap requeued = srun_task_env();
  requeued["SLURM_RESTART_COUNT"] = "2";
  EXPECT_EQ(slurm_task_worker_env(read_slurm_env(requeued), "a", 1, "r").restart_count, 2);

  EnvMap broken = srun_task_env();
  broken["SLURM_PROCID"] = "4";
  EXPECT_THROW(slurm_task_worker_env(read_slurm_env(broken), "a", 1, "r"), UsageError);
  EXPECT_THROW(slurm_task_worker_env(read_slurm_env(batch_env()), "a", 1, "r"), UsageError);
}

TEST(SlurmEnv, MalformedValuesNameTheVariable) {
  auto message = [](EnvMap env) -> std::string {
    try {
      read_slurm_env(env);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message({{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "two"}}).find("SLURM_NNODES='two'"),
            std::string::npos);
  EXPECT_NE(message({{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "0"}}).find("SLURM_NNODES=0"),
            std::string::npos);
  EXPECT_NE(message({{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "2"}, {"SLURM_NODEID", "2"}})
                .find("SLURM_NODEID=2 is not below SLURM_NNODES=2"),
            std::string::npos);
  EXPECT_NE(message({{"SLURM_JOB_ID", "1"}, {"SLURM_JOB_NODELIST", "n[1-"}})
                .find("bad Slurm hostlist \"n[1-\""),
            std::string::npos);
  EXPECT_NE(message({{"SLURM_JOB_ID", "x1"}}).find("SLURM_JOB_ID='x1'"), std::string::npos);
  // Empty values count as unset.
  EXPECT_FALSE(read_slurm_env(EnvMap{{"SLURM_JOB_ID", ""}}).detected);
}

TEST(SlurmEnv, ExpandsSlurmCounts) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(expand_slurm_counts("2(x3),1", "X"), V({2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_counts("4", "X"), V({4}));
  EXPECT_EQ(expand_slurm_counts("1,2(x2)", "X"), V({1, 2, 2}));
  for (const char* bad : {"", "2(x)", "2(3)", "(x2)", "a", "2(x0)", "2(x2", "-1"}) {
    EXPECT_THROW(expand_slurm_counts(bad, "SLURM_TASKS_PER_NODE"), UsageError) << bad;
  }
}

}  // namespace
}  // namespace dlaunch
