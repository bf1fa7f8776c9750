// dlaunch under a real Slurm (label cluster): munged, slurmctld and four slurmd in multiple-
// slurmd mode on 127.0.0.11-14, started by the ctest fixture (tests/cluster/start_slurm.sh).
// Jobs run the real dlaunch and test worker binaries through srun and sbatch.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "slurm_test_env.h"
#include "tests/support/subprocess.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;
using testing::RunResult;
using testing::TempDir;

// Worker key ("<task>" or "<task>/<local prefix>") -> its printed contract.
using Workers = std::map<std::string, std::map<std::string, std::string>>;

// Parses `srun --label` output of print-env workers: "0: [default1]:RANK=1" (agent mode: srun's
// task label, then dlaunch's local-rank prefix) or "3: RANK=3" (task mode).
Workers parse_print_env(const std::string& out) {
  static const std::regex line_re(R"(^\s*(\d+): (?:\[([^\]]*)\]:)?([A-Z_]+)=(.*)$)");
  Workers workers;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, line_re)) continue;
    std::string who = m[1].str() + (m[2].matched ? "/" + m[2].str() : "");
    workers[who][m[3]] = m[4];
  }
  return workers;
}

class SlurmClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto where = test::find_test_slurm();
    if (where.conf.empty()) GTEST_SKIP() << where.skip_reason;
    conf_ = where.conf;
  }

  // Runs a Slurm client (srun, sbatch, ...) found on PATH, pointed at the test cluster.
  RunResult run(std::vector<std::string> argv, std::chrono::milliseconds timeout = 120s) {
    argv[0] = which(argv[0]);
    return testing::run(argv, {{"SLURM_CONF", conf_}}, timeout);
  }

  static std::string which(const std::string& program) {
    if (program.find('/') != std::string::npos) return program;
    const char* path = std::getenv("PATH");
    std::istringstream dirs(path ? path : "/usr/bin:/bin");
    for (std::string d; std::getline(dirs, d, ':');) {
      std::string candidate = d + "/" + program;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return program;
  }

  // Submits a batch job; returns its id.
  std::string sbatch(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"sbatch", "--parsable"};
    argv.insert(argv.end(), args.begin(), args.end());
    RunResult r = run(argv, 30s);
    EXPECT_EQ(r.exit.code, 0) << r.out << r.err;
    if (r.exit.code != 0) return "";
    return r.out.substr(0, r.out.find_first_of(";\n"));
  }

  bool job_gone(const std::string& id, std::chrono::milliseconds timeout) {
    return testing::wait_until(
        [&] {
          RunResult r = run({"squeue", "-h", "-j", id}, 10s);
          return r.exit.code == 0 && r.out.find_first_not_of(" \n") == std::string::npos;
        },
        timeout);
  }

  // The pids in DIR/ready.<rank> once `n` workers are up.
  std::vector<pid_t> wait_ready(const TempDir& dir, int n, std::chrono::milliseconds timeout) {
    std::vector<pid_t> pids;
    testing::wait_until(
        [&] {
          pids.clear();
          for (int r = 0; r < n; ++r) {
            std::string path = dir.file("ready." + std::to_string(r));
            if (!testing::file_exists(path)) return false;
            pid_t pid = std::atoi(testing::read_file(path).c_str());
            if (pid <= 0) return false;
            pids.push_back(pid);
          }
          return true;
        },
        timeout);
    return pids;
  }

  std::string conf_;
};

// The recommended pattern: one dlaunch per node, each starting two workers; dlaunch takes the
// node count, node rank, master and port from Slurm and runs the static rendezvous.
TEST_F(SlurmClusterTest, AgentPerNodeGivesRanksWorldSizeAndMaster) {
  RunResult r = run({"srun", "-N2", "-w", "127.0.0.[11-12]", "--ntasks-per-node=1", "--label",
                     DLAUNCH_BIN, "--nproc_per_node=2", TEST_WORKER_BIN, "print-env"});
  ASSERT_EQ(r.exit.code, 0) << r.out << r.err;
  Workers w = parse_print_env(r.out);
  ASSERT_EQ(w.size(), 4u) << r.out;
  std::set<std::string> ranks;
  const std::string run_id = w.begin()->second["TORCHELASTIC_RUN_ID"];
  for (const auto& [who, env] : w) {
    const std::string task = who.substr(0, who.find('/'));  // srun task = node rank here
    ranks.insert(env.at("RANK"));
    EXPECT_EQ(env.at("GROUP_RANK"), task) << who;
    EXPECT_EQ(std::stoi(env.at("RANK")), 2 * std::stoi(task) + std::stoi(env.at("LOCAL_RANK")));
    EXPECT_EQ(env.at("WORLD_SIZE"), "4");
    EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "2");
    EXPECT_EQ(env.at("GROUP_WORLD_SIZE"), "2");
    EXPECT_EQ(env.at("MASTER_ADDR"), "127.0.0.11");
    EXPECT_EQ(env.at("MASTER_PORT"), std::to_string(20000 + std::stoll(run_id) % 10000));
    EXPECT_EQ(env.at("TORCHELASTIC_RUN_ID"), run_id);
    EXPECT_EQ(env.at("TORCHELASTIC_USE_AGENT_STORE"), "True");
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1", "2", "3"}));
}

TEST_F(SlurmClusterTest, TaskPerWorkerContractComesFromSlurmIds) {
  // -w: fixed nodes, so the master is known (Slurm may otherwise pick others while earlier
  // jobs' nodes are still completing).
  RunResult r = run({"srun", "-N2", "-w", "127.0.0.[11-12]", "--ntasks-per-node=2", "--label",
                     DLAUNCH_BIN, TEST_WORKER_BIN, "print-env"});
  ASSERT_EQ(r.exit.code, 0) << r.out << r.err;
  Workers w = parse_print_env(r.out);
  ASSERT_EQ(w.size(), 4u) << r.out;
  const std::string run_id = w["0"]["TORCHELASTIC_RUN_ID"];
  const int64_t job_id = std::stoll(run_id);
  for (const auto& [task, env] : w) {
    const int t = std::stoi(task);
    EXPECT_EQ(env.at("RANK"), task);  // RANK = SLURM_PROCID
    EXPECT_EQ(env.at("LOCAL_RANK"), std::to_string(t % 2));
    EXPECT_EQ(env.at("WORLD_SIZE"), "4");
    EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "2");
    EXPECT_EQ(env.at("GROUP_RANK"), std::to_string(t / 2));
    EXPECT_EQ(env.at("GROUP_WORLD_SIZE"), "2");
    EXPECT_EQ(env.at("MASTER_ADDR"), "127.0.0.11");  // first host of SLURM_STEP_NODELIST
    EXPECT_EQ(env.at("MASTER_PORT"), std::to_string(20000 + job_id % 10000));
    EXPECT_EQ(env.at("TORCHELASTIC_RUN_ID"), run_id);
    EXPECT_EQ(env.at("TORCHELASTIC_USE_AGENT_STORE"), "False");  // no agent: torch hosts it
  }
}

TEST_F(SlurmClusterTest, DryRunNamesTheSlurmVariableBehindEachValue) {
  RunResult r = run({"srun", "-N2", "-w", "127.0.0.[11-12]", "--ntasks-per-node=1", "--label",
                     DLAUNCH_BIN, "--nproc_per_node=2", "--dry_run", TEST_WORKER_BIN, "ok"});
  ASSERT_EQ(r.exit.code, 0) << r.out << r.err;
  for (const char* task : {"0", "1"}) {
    std::string prefix = std::string(task) + ":   ";
    EXPECT_NE(r.out.find(prefix + "nnodes                 = 2                        <- "
                                  "SLURM_STEP_NUM_NODES"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(prefix + "node_rank              = " + task), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(prefix + "master_addr            = 127.0.0.11"), std::string::npos);
    EXPECT_NE(r.out.find("<- first host of SLURM_STEP_NODELIST"), std::string::npos);
    EXPECT_NE(r.out.find(prefix + "slurm_mode             = agent"), std::string::npos);
  }
  // An explicit flag wins over Slurm.
  r = run({"srun", "-N1", DLAUNCH_BIN, "--master_port=29999", "--dry_run", TEST_WORKER_BIN, "ok"});
  EXPECT_NE(r.out.find("master_port            = 29999                    <- --master_port"),
            std::string::npos)
      << r.out;
}

TEST_F(SlurmClusterTest, BatchScriptOfAMultiNodeJobIsRefusedWithTheSrunRecipe) {
  TempDir dir;
  std::string id = sbatch({"-N2", "--output=" + dir.file("out"), "--wrap",
                           std::string(DLAUNCH_BIN) + " " + TEST_WORKER_BIN + " ok; echo EXIT=$?"});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(job_gone(id, 60s));
  std::string out = testing::read_file(dir.file("out"));
  EXPECT_NE(out.find("EXIT=2"), std::string::npos) << out;
  EXPECT_NE(out.find("srun --ntasks-per-node=1 dlaunch"), std::string::npos) << out;
}

TEST_F(SlurmClusterTest, SingleNodeAgentHostsTheStoreOnTheDerivedPort) {
  RunResult r = run({"srun", "-N1", "-w", "127.0.0.11", "--label", DLAUNCH_BIN,
                     "--nproc_per_node=2", TEST_WORKER_BIN, "print-env"});
  ASSERT_EQ(r.exit.code, 0) << r.out << r.err;
  Workers w = parse_print_env(r.out);
  ASSERT_EQ(w.size(), 2u) << r.out;
  for (const auto& [who, env] : w) {
    EXPECT_EQ(env.at("WORLD_SIZE"), "2");
    EXPECT_EQ(env.at("MASTER_ADDR"), "127.0.0.11");
    EXPECT_EQ(env.at("MASTER_PORT"),
              std::to_string(20000 + std::stoll(env.at("TORCHELASTIC_RUN_ID")) % 10000));
    EXPECT_EQ(env.at("TORCHELASTIC_USE_AGENT_STORE"), "True");
  }
}

// scancel: Slurm sends SIGTERM, then SIGKILL after KillWait (5 s here). Workers that ignore
// SIGTERM are killed too: nothing survives the job.
TEST_F(SlurmClusterTest, ScancelLeavesNoWorkerAlive) {
  for (const char* mode : {"sleep", "ignore-sigterm"}) {
    SCOPED_TRACE(mode);
    TempDir dir;
    std::string id =
        sbatch({"-N2", "--ntasks-per-node=1", "--output=" + dir.file("out"), "--wrap",
                "srun " + std::string(DLAUNCH_BIN) + " --nproc_per_node=2 --shutdown_grace=2 " +
                    TEST_WORKER_BIN + " " + mode + " ready=" + dir.path()});
    ASSERT_FALSE(id.empty());
    auto pids = wait_ready(dir, 4, 60s);  // 2 nodes x 2 workers
    ASSERT_EQ(pids.size(), 4u) << testing::read_file(dir.file("out"));
    for (pid_t p : pids) EXPECT_TRUE(testing::process_alive(p));
    ASSERT_EQ(run({"scancel", id}, 10s).exit.code, 0);
    EXPECT_TRUE(job_gone(id, 60s));
    EXPECT_TRUE(testing::wait_until(
        [&] {
          for (pid_t p : pids) {
            if (testing::process_alive(p)) return false;
          }
          return true;
        },
        30s))
        << testing::read_file(dir.file("out"));
  }
}

// With proctrack/cgroup only the agent may get the scheduler's SIGTERM: send it to dlaunch
// alone and check the workers got it from dlaunch, and the step ended.
TEST_F(SlurmClusterTest, SigtermToTheAgentIsForwardedToEveryWorker) {
  TempDir dir;
  std::string id = sbatch({"-N1", "--output=" + dir.file("out"), "--wrap",
                           "srun " + std::string(DLAUNCH_BIN) + " --nproc_per_node=2 " +
                               TEST_WORKER_BIN + " record-signals file=" + dir.file("sig") +
                               " ready=" + dir.path() + "; echo EXIT=$?"});
  ASSERT_FALSE(id.empty());
  auto pids = wait_ready(dir, 2, 60s);
  ASSERT_EQ(pids.size(), 2u) << testing::read_file(dir.file("out"));
  // The workers' parent is dlaunch.
  std::ifstream stat("/proc/" + std::to_string(pids[0]) + "/stat");
  std::string pid_s, comm, state;
  pid_t agent = 0;
  stat >> pid_s >> comm >> state >> agent;
  ASSERT_GT(agent, 1);
  ASSERT_EQ(::kill(agent, SIGTERM), 0);
  ASSERT_TRUE(job_gone(id, 60s)) << testing::read_file(dir.file("out"));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(testing::read_file(dir.file("sig." + std::to_string(rank))).find("SIGTERM"),
              std::string::npos);
  }
  std::string out = testing::read_file(dir.file("out"));
  EXPECT_NE(out.find("EXIT=143"), std::string::npos) << out;  // 128 + SIGTERM
}

// Preemption: --signal=USR1@T makes Slurm send SIGUSR1 ahead of the time limit; the workers get
// it (checkpoint time), and when the step is then stopped dlaunch exits 75: requeue.
TEST_F(SlurmClusterTest, PreemptionNoticeEndsWithTheRequeueCode) {
  TempDir dir;
  std::string id = sbatch(
      {"-N1", "-t", "2", "--signal=USR1@110", "--output=" + dir.file("out"), "--wrap",
       "srun " + std::string(DLAUNCH_BIN) + " --nproc_per_node=2 " + TEST_WORKER_BIN +
           " record-signals file=" + dir.file("sig") + " ready=" + dir.path() + "; echo EXIT=$?"});
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(wait_ready(dir, 2, 60s).size(), 2u) << testing::read_file(dir.file("out"));
  // Slurm checks signal deadlines periodically: allow a generous wait.
  ASSERT_TRUE(testing::wait_until(
      [&] {
        return testing::read_file(dir.file("sig.0")).find("SIGUSR1") != std::string::npos &&
               testing::read_file(dir.file("sig.1")).find("SIGUSR1") != std::string::npos;
      },
      100s))
      << testing::read_file(dir.file("out"));
  // Then the scheduler stops the step (as at preemption): SIGTERM to the step's processes.
  ASSERT_EQ(run({"scancel", "--signal=TERM", id + ".0"}, 10s).exit.code, 0);
  ASSERT_TRUE(job_gone(id, 60s));
  std::string out = testing::read_file(dir.file("out"));
  EXPECT_NE(out.find("EXIT=75"), std::string::npos) << out;
  EXPECT_NE(out.find("preempted"), std::string::npos) << out;
}

#ifdef DTRAIN_BIN
// examples/slurm/dtrain.sbatch as a user would submit it: dtrain on 2 nodes x 2 workers.
TEST_F(SlurmClusterTest, DtrainSbatchTrainsOnTwoNodes) {
  TempDir dir;
  std::string id =
      sbatch({"--output=" + dir.file("out"), "--chdir=" + dir.path(),
              "--export=ALL,DLAUNCH=" + std::string(DLAUNCH_BIN) + ",DTRAIN=" + DTRAIN_BIN +
                  ",DTRAIN_ARGS=--dataset=synthetic --epochs=1 --max_steps=2 --batch_size=8 "
                  "--width=4 --eval_every=0",
              std::string(DLAUNCH_SOURCE_DIR) + "/examples/slurm/dtrain.sbatch"});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(job_gone(id, 280s)) << testing::read_file(dir.file("out"));
  std::string out = testing::read_file(dir.file("out"));
  // Both agents resolved the same job from Slurm, and the 4 workers finished.
  EXPECT_NE(out.find("nnodes                 = 2                        <- SLURM_STEP_NUM_NODES"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("global ranks 0-1 of 4 (node 0 of 2)"), std::string::npos) << out;
  EXPECT_NE(out.find("global ranks 2-3 of 4 (node 1 of 2)"), std::string::npos) << out;
  EXPECT_EQ(out.find("srun: error"), std::string::npos) << out;
  EXPECT_TRUE(testing::file_exists(dir.file("dtrain-" + id))) << out;
}

// Issue 18: preemption used to lose the work. examples/slurm/dtrain.sbatch on 2 nodes x 2
// workers; `scancel --signal=USR1` mid-epoch (the notice): every rank finishes the same step,
// rank 0 checkpoints it, dlaunch exits 75, the script requeues the job, and the requeued run
// continues after that step and finishes; --open-mode=append keeps both runs in one log.
TEST_F(SlurmClusterTest, PreemptedDtrainIsRequeuedAndResumesAtTheStep) {
  TempDir dir;
  // 4000 samples / 4 ranks / 16 = 63 steps per epoch, 2 epochs.
  std::string id =
      sbatch({"--output=" + dir.file("out"), "--chdir=" + dir.path(),
              "--export=ALL,DLAUNCH=" + std::string(DLAUNCH_BIN) + ",DTRAIN=" + DTRAIN_BIN +
                  ",DTRAIN_LIMIT_TRAIN_SAMPLES=4000,DTRAIN_LIMIT_TEST_SAMPLES=100,OMP_NUM_THREADS=1"
                  ",DTRAIN_ARGS=--dataset=synthetic --epochs=2 --batch_size=16 --width=8 "
                  "--log_every=1",
              std::string(DLAUNCH_SOURCE_DIR) + "/examples/slurm/dtrain.sbatch"});
  ASSERT_FALSE(id.empty());
  const std::string metrics = dir.file("dtrain-" + id + "/metrics.jsonl");
  auto last_step = [&]() -> int64_t {
    std::istringstream lines(testing::read_file(metrics));
    int64_t step = 0;
    static const std::regex step_re(R"("kind":"step".*"step":(\d+))");
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (std::regex_search(line, m, step_re)) step = std::stoll(m[1]);
    }
    return step;
  };
  ASSERT_TRUE(testing::wait_until([&] { return last_step() >= 5; }, 240s))
      << testing::read_file(dir.file("out"));
  ASSERT_EQ(run({"scancel", "--signal=USR1", id}, 10s).exit.code, 0);
  ASSERT_TRUE(testing::wait_until(
      [&] { return testing::read_file(dir.file("out")).find("requeueing") != std::string::npos; },
      120s))
      << testing::read_file(dir.file("out"));
  const int64_t stopped_at = last_step();
  // Slurm holds a requeued job back (its begin time moves about two minutes ahead): once it is
  // pending for that reason and no node still completes a job, let it start now. Not earlier:
  // while the first run's batch script is still ending, an update can race its completion and
  // the job ends instead of running (seen on a loaded host).
  // And not at the first sight of the hold either: the batch script may still be ending without
  // any node saying "completing" (a clean-clone CI run saw the job end instead of running once
  // more), so the hold must have been seen for a few seconds first.
  std::string queue_seen;  // squeue's answers, for the failure message
  std::optional<std::chrono::steady_clock::time_point> held_since;
  ASSERT_TRUE(testing::wait_until(
      [&] {
        if (testing::read_file(dir.file("out")).find("done: 2 epochs") != std::string::npos) {
          return true;
        }
        RunResult r = run({"squeue", "-h", "-o", "%T %r", "-j", id}, 10s);
        if (queue_seen.size() < 4096) queue_seen += r.out;
        const bool completing =
            run({"sinfo", "-h", "-o", "%T"}, 10s).out.find("completing") != std::string::npos;
        const bool held = r.out.find("PENDING BeginTime") != std::string::npos;
        if (!held || completing) {
          held_since.reset();
        } else if (!held_since) {
          held_since = std::chrono::steady_clock::now();
        } else if (std::chrono::steady_clock::now() - *held_since >= 5s) {
          run({"scontrol", "update", "JobId=" + id, "StartTime=now"}, 10s);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        return false;
      },
      240s))
      << testing::read_file(dir.file("out")) << "squeue said:\n" << queue_seen
      << run({"scontrol", "show", "job", id}, 10s).out
      << run({"sinfo", "-N", "-o", "%N %T"}, 10s).out;
  ASSERT_TRUE(job_gone(id, 60s));
  std::string out = testing::read_file(dir.file("out"));
  ASSERT_LT(stopped_at, 126) << "training ended before the notice\n" << out;
  // The first run's log is still there (--open-mode=append) and says how it stopped.
  EXPECT_NE(out.find("stopped by SIGUSR1 after step"), std::string::npos) << out;
  EXPECT_NE(out.find("preempted (dlaunch exit 75)"), std::string::npos) << out;
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint_epoch_%04lld_step_%08lld.dtck",
                static_cast<long long>((stopped_at - 1) / 63), static_cast<long long>(stopped_at));
  EXPECT_NE(out.find("resumed from " + dir.file("dtrain-" + id + "/" + std::string(name))),
            std::string::npos)
      << out;
  // Every step once, in order, across the two runs: nothing redone, nothing skipped.
  std::istringstream lines(testing::read_file(metrics));
  static const std::regex step_re(R"("kind":"step".*"step":(\d+))");
  int64_t expect = 1;
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, step_re)) continue;
    EXPECT_EQ(std::stoll(m[1]), expect) << line;
    expect = std::stoll(m[1]) + 1;
  }
  EXPECT_EQ(expect, 127);
}
#endif

TEST_F(SlurmClusterTest, PyTorchScriptOneTaskPerWorker) {
  TempDir dir;
  // The job runs in the source tree (--chdir), where the script's default SCRIPT lives.
  std::string id = sbatch({"--output=" + dir.file("out"),
                           "--export=ALL,MODE=task,DLAUNCH=" + std::string(DLAUNCH_BIN),
                           "--chdir=" + std::string(DLAUNCH_SOURCE_DIR),
                           std::string(DLAUNCH_SOURCE_DIR) + "/examples/slurm/pytorch.sbatch"});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(job_gone(id, 120s));
  std::string out = testing::read_file(dir.file("out"));
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(out.find("rank " + std::to_string(rank) +
                       "/4: all_reduce sum 6 (restart 0, agent "
                       "store False)"),
              std::string::npos)
        << out;
  }
}

TEST_F(SlurmClusterTest, PyTorchScriptOneAgentPerNode) {
  TempDir dir;
  std::string id = sbatch({"--output=" + dir.file("out"),
                           "--export=ALL,MODE=agent,DLAUNCH=" + std::string(DLAUNCH_BIN),
                           "--chdir=" + std::string(DLAUNCH_SOURCE_DIR),
                           std::string(DLAUNCH_SOURCE_DIR) + "/examples/slurm/pytorch.sbatch"});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(job_gone(id, 120s));
  std::string out = testing::read_file(dir.file("out"));
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(out.find("rank " + std::to_string(rank) +
                       "/4: all_reduce sum 6 (restart 0, agent "
                       "store True)"),
              std::string::npos)
        << out;
  }
}

}  // namespace
}  // namespace dlaunch
