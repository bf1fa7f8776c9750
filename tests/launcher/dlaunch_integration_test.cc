// Integration tests: the real dlaunch binary running the real test worker, one test per
// guarantee of docs/cli.md. Generous timeouts; they assert behaviour, never speed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN;
const std::string kWorker = TEST_WORKER_BIN;

// The signal tests must not inherit ignored signals from whatever runs them
// (with_default_signals).
std::vector<std::string> cmd(std::vector<std::string> flags, std::vector<std::string> worker) {
  std::vector<std::string> argv = {kDlaunch};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(kWorker);
  argv.insert(argv.end(), worker.begin(), worker.end());
  return with_default_signals(std::move(argv));
}

// "[default1]:KEY=VALUE" lines -> per local rank maps.
std::map<int, std::map<std::string, std::string>> parse_env_lines(const std::string& out,
                                                                   const std::string& role) {
  std::map<int, std::map<std::string, std::string>> env;
  for (const auto& line : lines_with_prefix(out, "[" + role)) {
    size_t close = line.find("]:");
    if (close == std::string::npos) continue;
    int lr = std::stoi(line.substr(role.size() + 1, close - role.size() - 1));
    std::string kv = line.substr(close + 2);
    size_t eq = kv.find('=');
    if (eq != std::string::npos) env[lr][kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

TEST(DlaunchEnv, ContractForThreeWorkers) {
  auto r = run(cmd({"--standalone", "--nproc_per_node=3", "--max_restarts", "2", "--role",
                    "trainer"},
                   {"print-env"}),
               {{"OMP_NUM_THREADS", ""}});
  // An empty OMP_NUM_THREADS is still "set by the user": dlaunch must not replace it.
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  auto env = parse_env_lines(r.out, "trainer");
  ASSERT_EQ(env.size(), 3u) << r.out;
  std::set<std::string> ports, run_ids;
  for (int lr = 0; lr < 3; ++lr) {
    auto& e = env[lr];
    EXPECT_EQ(e["RANK"], std::to_string(lr));
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(lr));
    EXPECT_EQ(e["WORLD_SIZE"], "3");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(e["GROUP_RANK"], "0");
    EXPECT_EQ(e["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(e["ROLE_RANK"], std::to_string(lr));
    EXPECT_EQ(e["ROLE_WORLD_SIZE"], "3");
    EXPECT_EQ(e["ROLE_NAME"], "trainer");
    EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(e["TORCHELASTIC_MAX_RESTARTS"], "2");
    EXPECT_TRUE(e["TORCHELASTIC_USE_AGENT_STORE"] == "True" ||
                e["TORCHELASTIC_USE_AGENT_STORE"] == "False");
    EXPECT_EQ(e["OMP_NUM_THREADS"], "");
    EXPECT_EQ(e["NCCL_ASYNC_ERROR_HANDLING"], "1");
    EXPECT_EQ(e["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
    EXPECT_EQ(e["DLAUNCH_ATTEMPT"], "0");
    EXPECT_NE(e["DLAUNCH_NODE_ID"], "<unset>");
    EXPECT_EQ(e["DLAUNCH_FLASH_DIR"].rfind("/dev/shm/dlaunch_flash_", 0), 0u) << e["DLAUNCH_FLASH_DIR"];
    EXPECT_EQ(e["DLAUNCH_SHUTDOWN_GRACE"], "5");  // --shutdown_grace's default, in seconds
    std::string suffix = "/attempt_0/" + std::to_string(lr) + "/error.json";
    EXPECT_GE(e["TORCHELASTIC_ERROR_FILE"].size(), suffix.size());
    EXPECT_TRUE(e["TORCHELASTIC_ERROR_FILE"].rfind(suffix) ==
                e["TORCHELASTIC_ERROR_FILE"].size() - suffix.size())
        << e["TORCHELASTIC_ERROR_FILE"];
    EXPECT_NE(e["DLAUNCH_HEARTBEAT_FILE"].find("/attempt_0/" + std::to_string(lr) + "/"),
              std::string::npos);
    int port = std::stoi(e["MASTER_PORT"]);
    EXPECT_GT(port, 0);
    EXPECT_LT(port, 65536);
    ports.insert(e["MASTER_PORT"]);
    run_ids.insert(e["TORCHELASTIC_RUN_ID"]);
  }
  EXPECT_EQ(ports.size(), 1u);
  ASSERT_EQ(run_ids.size(), 1u);
  // --standalone: a random run id, never torchrun's static "none".
  EXPECT_NE(*run_ids.begin(), "none");
  EXPECT_EQ(run_ids.begin()->size(), 16u);
}

TEST(DlaunchEnv, DefaultsMatchTorchrunForStaticJobs) {
  auto r = run(cmd({"--nproc-per-node", "2", "--master_port", "0"}, {"print-env"}));
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  auto env = parse_env_lines(r.out, "default");
  ASSERT_EQ(env.size(), 2u) << r.out;
  EXPECT_EQ(env[0]["TORCHELASTIC_RUN_ID"], "none");
  EXPECT_EQ(env[1]["ROLE_NAME"], "default");
  // OMP_NUM_THREADS = max(1, cores / workers), unless the user set it.
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  EXPECT_EQ(env[0]["OMP_NUM_THREADS"], std::to_string(std::max(1L, cores / 2)));
}

TEST(DlaunchEnv, EnvTwinAndFlagPrecedence) {
  auto r = run(cmd({"--master_port=0"}, {"print-env"}), {{"DLAUNCH_NPROC_PER_NODE", "2"}});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(parse_env_lines(r.out, "default").size(), 2u);
  r = run(cmd({"--master_port=0", "--nproc_per_node", "1"}, {"print-env"}),
          {{"DLAUNCH_NPROC_PER_NODE", "2"}});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(parse_env_lines(r.out, "default").size(), 1u);
}

TEST(DlaunchExit, SuccessIsZero) {
  auto r = run(cmd({"--standalone", "--nproc_per_node", "2"}, {"ok"}));
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(lines_with_prefix(r.out, "[default0]:ok rank=0").size(), 1u) << r.out;
  EXPECT_EQ(lines_with_prefix(r.out, "[default1]:ok rank=1").size(), 1u) << r.out;
}

TEST(DlaunchExit, FailureIsOneAndReportNamesTheFirstFailure) {
  auto r = run(cmd({"--standalone", "--nproc_per_node", "3", "--shutdown_grace", "5"},
                   {"crash", "code=7", "rank=2"}));
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(r.err.find("Root cause (first observed failure)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank      : 2 (local_rank: 2)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exitcode  : 7"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("crashing on purpose"), std::string::npos) << r.err;  // stderr tail
  // The others were stopped by dlaunch: listed as consequences, with the signal's name.
  EXPECT_NE(r.err.find("rank 0 (local_rank 0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("SIGTERM"), std::string::npos) << r.err;
}

// A grandchild that keeps writing to the worker's stdout after the worker died must not keep
// the agent reading at the exit (it hung there for good): the failure is reported and the
// grandchild goes with the group.
TEST(DlaunchExit, ChattyGrandchildDoesNotBlockTheExitReport) {
  auto r = run({kDlaunch, "--nproc_per_node", "1", "--no_python", "/bin/sh", "-c",
                "(yes &); sleep 0.2; exit 3"},
               {}, 60s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(r.err.find("exitcode  : 3"), std::string::npos) << r.err;
}

TEST(DlaunchExit, SegfaultIsReportedBySignalName) {
  auto r = run(cmd({"--standalone"}, {"segv"}));
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(r.err.find("SIGSEGV"), std::string::npos) << r.err;
}

TEST(DlaunchExit, ErrorFileIsTheReportedCause) {
  auto r = run(cmd({"--standalone"}, {"write-error-file", "code=5", "message=KeyError: 42"}));
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(r.err.find("KeyError: 42"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Traceback (most recent call last)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("error.json"), std::string::npos) << r.err;
  // With an error file, the stderr tail is not what the report shows as the cause.
  size_t report = r.err.find("Root cause");
  ASSERT_NE(report, std::string::npos);
  EXPECT_EQ(r.err.find("this stderr line must not be the reported cause", report),
            std::string::npos)
      << r.err;
}

// Under a parent launcher that set TORCHELASTIC_ERROR_FILE, the root cause is handed up.
TEST(DlaunchExit, RootCauseErrorFileGoesToTheParentLauncher) {
  TempDir dir;
  std::string parent = dir.file("parent_error.json");
  auto r = run(cmd({"--standalone"}, {"write-error-file", "message=KeyError: 7"}),
               {{"TORCHELASTIC_ERROR_FILE", parent}});
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(read_file(parent).find("KeyError: 7"), std::string::npos) << read_file(parent);
  r = run(cmd({"--standalone"}, {"segv"}), {{"TORCHELASTIC_ERROR_FILE", parent}});
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(read_file(parent).find("SIGSEGV"), std::string::npos) << read_file(parent);
}

TEST(DlaunchRestart, CrashOnceRestartsWithIncrementedCount) {
  auto r = run(cmd({"--standalone", "--nproc_per_node", "2", "--max_restarts", "1"},
                   {"crash-once"}));
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(lines_with_prefix(r.out, "[default0]:ok rank=0 restart_count=1").size(), 1u) << r.out;
  EXPECT_EQ(lines_with_prefix(r.out, "[default1]:ok rank=1 restart_count=1").size(), 1u) << r.out;
}

// One node has no rendezvous round, yet each attempt's workers must see the store without the
// failed attempt's keys (PyTorch 2.x workers' keys carry no restart count).
TEST(DlaunchRestart, RestartedWorkersDoNotSeeTheFailedAttemptsKeys) {
  auto r = run(cmd({"--standalone", "--nproc_per_node", "2", "--max_restarts", "1"},
                   {"store-leftover"}));
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(lines_with_prefix(r.out, "[default0]:leftover rank=0 seen=no").size(), 1u) << r.out;
  EXPECT_EQ(lines_with_prefix(r.out, "[default1]:leftover rank=1 seen=no").size(), 1u) << r.out;
}

TEST(DlaunchRestart, BudgetRunsOutThenExitOne) {
  TempDir logs;
  auto r = run(cmd({"--standalone", "--max_restarts", "2", "--log_dir", logs.path(), "--rdzv_id",
                    "budget"},
                   {"crash", "code=4"}));
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(r.err.find("after 2 restart(s) of 2 allowed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Earlier attempts"), std::string::npos) << r.err;
  for (int a = 0; a < 3; ++a) {
    EXPECT_TRUE(file_exists(logs.path() + "/budget/attempt_" + std::to_string(a) + "/0/stderr.log"))
        << a;
  }
  EXPECT_FALSE(file_exists(logs.path() + "/budget/attempt_3"));
}

TEST(DlaunchUsage, BadInputExitsTwoWithOneSentence) {
  struct Case {
    std::vector<std::string> args;
    std::string must_mention;
  };
  std::vector<Case> cases = {
      {{"--nproc_per_node=abc", "x"}, "--nproc_per_node"},
      {{"--nproc_per_node", "0", "x"}, "--nproc_per_node"},
      {{"--bogus", "x"}, "--bogus"},
      {{"--redirects", "7", "x"}, "--redirects"},
      {{"-r", "5:1", "--nproc_per_node", "2", "x"}, "local rank 5"},
      {{"--nnodes", "3:2", "x"}, "--nnodes"},
      {{"--module", "--no_python", "x"}, "--no_python"},
      {{"--max_restarts", "-1", "x"}, "--max_restarts"},
      {{"--master_port", "70000", "x"}, "--master_port"},
      {{"--standalone", "--nnodes", "2", "x"}, "--standalone"},
      {{"--nproc_per_node"}, "--nproc_per_node"},
      {{"-m"}, "no program"},
      {{"--nprocs_per_node", "2", "x"}, "did you mean --nproc_per_node?"},
      {{"--rdzv_conf", "join_timout=5", "x"}, "did you mean join_timeout?"},
      {{"--rdzv_conf", "join_timeout=soon", "x"}, "join_timeout"},
      {{"--slurm_mode", "foo", "x"}, "--slurm_mode='foo'"},
      {{"--master_port", "0", "--nnodes", "2", "x"}, "--master_port=0"},
      {{"--nnodes", "1:2", "x"}, "needs --rdzv_endpoint"},
      // etcd's endpoint list (etcdctl's form): each entry must parse.
      {{"--nnodes", "1:2", "--rdzv_backend", "etcd", "--rdzv_endpoint",
        "127.0.0.1:23801,,127.0.0.1:23811", "x"},
       "--rdzv_endpoint: endpoint 2 of '127.0.0.1:23801,,127.0.0.1:23811' is empty"},
      {{"--nnodes", "1:2", "--rdzv_backend", "etcd", "--rdzv_endpoint",
        "127.0.0.1:23801,127.0.0.1:http", "x"},
       "--rdzv_endpoint: endpoint '127.0.0.1:http'"},
  };
  // --dry_run refuses exactly what a run refuses.
  for (const std::vector<std::string>& mode : {std::vector<std::string>{}, {"--dry_run"}}) {
    for (const auto& c : cases) {
      std::vector<std::string> argv = {kDlaunch};
      argv.insert(argv.end(), mode.begin(), mode.end());
      argv.insert(argv.end(), c.args.begin(), c.args.end());
      auto r = run(argv);
      EXPECT_EQ(r.exit.shell_code(), 2) << mode.size() << " " << c.must_mention << " " << r.err;
      EXPECT_NE(r.err.find(c.must_mention), std::string::npos) << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
      EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
    }
  }
  auto bad_env = run({kDlaunch, "x"}, {{"DLAUNCH_MAX_RESTARTS", "many"}});
  EXPECT_EQ(bad_env.exit.shell_code(), 2);
  EXPECT_NE(bad_env.err.find("DLAUNCH_MAX_RESTARTS"), std::string::npos) << bad_env.err;
}

TEST(DlaunchUsage, MissingOrNonExecutableProgram) {
  auto r = run({kDlaunch, "--standalone", "no_such_program_dlaunch"});
  EXPECT_EQ(r.exit.shell_code(), 2) << r.err;
  EXPECT_NE(r.err.find("'no_such_program_dlaunch' was not found in PATH"), std::string::npos)
      << r.err;
  TempDir dir;
  std::string path = dir.file("not_executable");
  {
    FILE* f = fopen(path.c_str(), "w");
    fputs("echo hi\n", f);
    fclose(f);
  }
  r = run({kDlaunch, "--standalone", path});
  EXPECT_EQ(r.exit.shell_code(), 2) << r.err;
  EXPECT_NE(r.err.find("cannot execute '" + path + "'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Permission denied"), std::string::npos) << r.err;
}

// `dlaunch --max_restarts 2 trian.py`: every worker failed, every restart was spent, exit 1.
// Now: exit 2 with "not found" before any worker starts.
TEST(DlaunchUsage, MissingScriptExitsTwoWithoutSpendingRestarts) {
  auto r = run({kDlaunch, "--standalone", "--max_restarts", "2", "--python", "/usr/bin/python3",
                "trian_dlaunch_missing.py"});
  EXPECT_EQ(r.exit.shell_code(), 2) << r.err;
  EXPECT_NE(r.err.find("python script 'trian_dlaunch_missing.py' was not found"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  EXPECT_EQ(r.err.find("starting"), std::string::npos) << "a worker was started\n" << r.err;
  EXPECT_EQ(r.err.find("restarting"), std::string::npos) << r.err;

  if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3 for -m";
  r = run({kDlaunch, "--standalone", "--max_restarts", "2", "--python", "/usr/bin/python3", "-m",
           "no_such_module_dlaunch.train"});
  EXPECT_EQ(r.exit.shell_code(), 2) << r.err;
  EXPECT_NE(r.err.find("module 'no_such_module_dlaunch.train' was not found"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("restarting"), std::string::npos) << r.err;
}

TEST(DlaunchUsage, DirectoryAsProgramSaysIsADirectory) {
  TempDir dir;
  auto r = run({kDlaunch, "--standalone", dir.path()});
  EXPECT_EQ(r.exit.shell_code(), 2) << r.err;
  EXPECT_NE(r.err.find("'" + dir.path() + "' is a directory"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("chmod"), std::string::npos) << r.err;
}

TEST(DlaunchUsage, HelpAndDryRun) {
  auto r = run({kDlaunch, "--help"});
  EXPECT_EQ(r.exit.shell_code(), 0);
  EXPECT_NE(r.out.find("--nproc_per_node"), std::string::npos);
  EXPECT_NE(r.out.find("DLAUNCH_HANG_TIMEOUT"), std::string::npos);
  r = run({kDlaunch, "--dry_run", "--max-restarts=3", "/bin/true"},
          {{"DLAUNCH_NPROC_PER_NODE", "4"}});
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.out.find("DLAUNCH_NPROC_PER_NODE"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--max-restarts"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("worker command (local rank 0): /bin/true"), std::string::npos) << r.out;
}

// --dry_run makes the run's own checks: a program that is not there exits 2, as the run would,
// at once. A name node 0 must host the store on that does not resolve yet is no such error: a
// master's name may resolve only once its host is up (a Kubernetes headless service), so the
// run waits for it up to the join timeout, then fails with what it looked up and got, and
// --dry_run says so in a note.
TEST(DlaunchUsage, DryRunRefusesWhatTheRunWould) {
  for (bool dry : {true, false}) {
    std::vector<std::string> flags = {kDlaunch, "--nnodes", "2", "--node_rank", "0",
                                      "--master_addr", "no-such-host.invalid", "--master_port",
                                      std::to_string(free_port()), "--rdzv_conf",
                                      "join_timeout=1", "--no_python", "/bin/true"};
    if (dry) flags.insert(flags.begin() + 1, "--dry_run");
    auto r = run(flags);
    if (dry) {
      EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
      EXPECT_NE(r.err.find("note: --master_addr=no-such-host.invalid does not resolve now"),
                std::string::npos)
          << r.err;
      EXPECT_NE(r.err.find("waits for the name up to the join timeout (1 s)"), std::string::npos)
          << r.err;
    } else {
      EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
      EXPECT_NE(r.err.find("'no-such-host.invalid' did not resolve within 1 s"),
                std::string::npos)
          << r.err;
    }
  }
  auto r = run({kDlaunch, "--dry_run", "--standalone", "trian.py"});
  EXPECT_EQ(r.exit.shell_code(), 2) << r.err;
  EXPECT_NE(r.err.find("trian.py"), std::string::npos) << r.err;
  // Node 1 connects to node 0, whose name may resolve only later (a pod not yet scheduled).
  r = run({kDlaunch, "--dry_run", "--nnodes", "2", "--node_rank", "1", "--master_addr",
           "no-such-host.invalid", "--no_python", "/bin/true"});
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(r.err.find("note:"), std::string::npos) << r.err;
}

// An etcd endpoint whose host name does not resolve fails the run at start: --dry_run says so
// too (exit 2). A list passes while one member resolves (the client fails over to it).
TEST(DlaunchUsage, DryRunRefusesAnEtcdHostThatDoesNotResolve) {
  for (bool dry : {true, false}) {
    std::vector<std::string> flags = {kDlaunch,        "--nnodes",
                                      "1:2",           "--rdzv_backend",
                                      "etcd",          "--rdzv_endpoint",
                                      "no-such-etcd.invalid:2379", "--no_python",
                                      "/bin/true"};
    if (dry) flags.insert(flags.begin() + 1, "--dry_run");
    auto r = run(flags);
    EXPECT_EQ(r.exit.shell_code(), 2) << r.err;
    EXPECT_NE(r.err.find("no etcd member's host name resolves: no-such-etcd.invalid"),
              std::string::npos)
        << r.err;
  }
  auto r = run({kDlaunch, "--dry_run", "--nnodes", "1:2", "--rdzv_backend", "etcd",
                "--rdzv_endpoint", "no-such-etcd.invalid:2379,127.0.0.1:2379", "--no_python",
                "/bin/true"});
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
}

// A list of etcd members passes --dry_run: it is parsed, not dialled.
TEST(DlaunchUsage, DryRunAcceptsAListOfEtcdMembers) {
  auto r =
      run({kDlaunch, "--dry_run", "--nnodes", "1:3", "--rdzv_backend", "etcd", "--rdzv_endpoint",
           "127.0.0.1:23801,http://127.0.0.1:23811,[::1]:23821", "--no_python", "/bin/true"});
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.out.find("127.0.0.1:23801,http://127.0.0.1:23811,[::1]:23821"), std::string::npos)
      << r.out;
}

TEST(DlaunchUsage, DryRunQuotesTheWorkerCommandAndShowsIgnoredSettings) {
  auto r = run({kDlaunch, "--dry_run", "--nnodes", "2", "--master_addr", "10.0.0.1", "--no_python",
                "/bin/sh", "-c", "echo \"$RANK\"; exit 0", "it's", ""});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  // Pasted into a shell, the line runs what the worker runs.
  EXPECT_NE(r.out.find("worker command (local rank 0): /bin/sh -c 'echo \"$RANK\"; exit 0' "
                       "'it'\\''s' ''"),
            std::string::npos)
      << r.out;
  for (const char* row : {"start_method", "use_env", "no_slurm", "local_addr"}) {
    EXPECT_NE(r.out.find(std::string("  ") + row + " "), std::string::npos) << row << r.out;
  }
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  EXPECT_NE(r.out.find(std::string("local_addr             = ") + host), std::string::npos)
      << r.out;
}

// README/--help: without a program, dlaunch runs dtrain from its own directory.
TEST(DlaunchUsage, NoProgramRunsDtrainBesideDlaunch) {
  auto r = run({kDlaunch, "--dry_run", "--nproc_per_node", "2"});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  std::string dtrain = kDlaunch.substr(0, kDlaunch.rfind('/')) + "/dtrain";
  EXPECT_NE(r.out.find("worker command (local rank 0): " + dtrain + "  <- default"),
            std::string::npos)
      << r.out;
}

// `dlaunch --version` and `dtrain --version`: "<name> <project version> (commit <c>, <build
// type> build)", where c is a commit of this checkout (or "unknown" outside one), and nothing is
// started.
TEST(DlaunchUsage, VersionPrintsTheVersionAndTheCommit) {
  std::vector<std::pair<std::string, std::string>> binaries = {{"dlaunch", kDlaunch}};
#ifdef DTRAIN_BIN
  binaries.emplace_back("dtrain", DTRAIN_BIN);
#endif
  // run() does not search PATH.
  const std::string git = file_exists("/usr/bin/git") ? "/usr/bin/git" : "/bin/git";
  auto in_git = run({git, "-C", SOURCE_DIR, "rev-parse", "--git-dir"});
  bool checkout = !in_git.timed_out && in_git.exit.shell_code() == 0;
  for (const auto& [name, path] : binaries) {
    auto r = run({path, "--version"});
    ASSERT_EQ(r.exit.shell_code(), 0) << name << ": " << r.err;
    std::string prefix = name + " " + PROJECT_VERSION_TEXT + " (commit ";
    ASSERT_EQ(r.out.rfind(prefix, 0), 0u) << r.out;
    const std::string suffix = std::string(", ") + BUILD_TYPE_TEXT + " build)\n";
    ASSERT_GE(r.out.size(), prefix.size() + suffix.size()) << r.out;
    EXPECT_EQ(r.out.substr(r.out.size() - suffix.size()), suffix) << r.out;
    std::string commit =
        r.out.substr(prefix.size(), r.out.size() - prefix.size() - suffix.size());
    if (!checkout) {
      EXPECT_EQ(commit, "unknown");
      continue;
    }
    EXPECT_GE(commit.size(), 7u) << commit;
    EXPECT_EQ(commit.find_first_not_of("0123456789abcdef"), std::string::npos) << commit;
    auto known = run({git, "-C", SOURCE_DIR, "cat-file", "-e", commit + "^{commit}"});
    EXPECT_EQ(known.exit.shell_code(), 0) << commit << " is not a commit of " << SOURCE_DIR;
  }
}

TEST(DlaunchSignals, SigtermIsForwardedAndExitIs143) {
  TempDir dir;
  Subprocess p(cmd({"--standalone", "--nproc_per_node", "2"},
                   {"record-signals", "file=" + dir.file("sig"), "ready=" + dir.path()}));
  ASSERT_TRUE(wait_ready(dir, 2, 30s)) << p.err();
  p.signal(SIGUSR2);
  // Both ranks must have recorded SIGUSR2 before SIGTERM is sent; else rank 0 may still be
  // about to record it when SIGTERM ends it.
  ASSERT_TRUE(wait_until([&] {
    return read_file(dir.file("sig.0")).find("SIGUSR2") != std::string::npos &&
           read_file(dir.file("sig.1")).find("SIGUSR2") != std::string::npos;
  }, 30s));
  p.signal(SIGTERM);
  auto exit = p.wait(60s);
  ASSERT_TRUE(exit) << p.err();
  EXPECT_EQ(exit->shell_code(), 128 + SIGTERM) << p.err();
  for (int r = 0; r < 2; ++r) {
    std::string sigs = read_file(dir.file("sig." + std::to_string(r)));
    EXPECT_NE(sigs.find("SIGUSR2"), std::string::npos) << sigs;
    EXPECT_NE(sigs.find("SIGTERM"), std::string::npos) << sigs;
  }
}

// The state letter of /proc/<pid>/stat ('T' when stopped), or 0 when the process is gone.
char process_state(pid_t pid) {
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(") ");
  return paren == std::string::npos || paren + 2 >= stat.size() ? 0 : stat[paren + 2];
}

// Ctrl-Z: the workers lead their own process groups, so only dlaunch got the terminal's
// SIGTSTP and they trained on. Now they stop with it, `fg` (SIGCONT) resumes them, and the time
// they spent stopped (longer than --hang_timeout) is not taken for a hang.
TEST(DlaunchSignals, CtrlZStopsTheWorkersAndSigcontResumesThem) {
  TempDir dir;
  // Workers that heartbeat every 50 ms from one thread and fork nothing: a shell loop's child
  // caught between vfork and exec leaves the shell in state D, not T, while its group is stopped.
  Subprocess p({"/usr/bin/env", "--default-signal=TSTP,CONT,TERM", kDlaunch, "--standalone",
                "--nproc_per_node", "2", "--hang_timeout", "2", kWorker, "beat", "seconds=300",
                "ready=" + dir.path()});
  ASSERT_TRUE(wait_ready(dir, 2, 30s)) << p.err();
  std::vector<pid_t> workers = {std::stoi(read_file(dir.file("ready.0"))),
                                std::stoi(read_file(dir.file("ready.1")))};
  p.signal(SIGTSTP);
  EXPECT_TRUE(wait_until([&] {
    return process_state(workers[0]) == 'T' && process_state(workers[1]) == 'T' &&
           process_state(p.pid()) == 'T';
  }, 30s)) << "states: " << process_state(workers[0]) << process_state(workers[1])
           << process_state(p.pid());
  std::this_thread::sleep_for(3s);  // longer than --hang_timeout
  p.signal(SIGCONT);
  EXPECT_TRUE(wait_until([&] {
    return process_state(workers[0]) != 'T' && process_state(workers[1]) != 'T' &&
           process_state(p.pid()) != 'T';
  }, 30s));
  std::this_thread::sleep_for(1500ms);  // a few hang checks after the resume
  p.signal(SIGTERM);
  auto exit = p.wait(60s);
  ASSERT_TRUE(exit) << p.err();
  EXPECT_EQ(exit->shell_code(), 128 + SIGTERM) << p.err();
  EXPECT_EQ(p.err().find("is hung"), std::string::npos) << p.err();
}

TEST(DlaunchSignals, SigintAndSighupExitWith128PlusN) {
  for (int sig : {SIGINT, SIGHUP}) {
    TempDir dir;
    Subprocess p(cmd({"--standalone"}, {"record-signals", "file=" + dir.file("sig"),
                                        "ready=" + dir.path()}));
    ASSERT_TRUE(wait_ready(dir, 1, 30s)) << p.err();
    p.signal(sig);
    auto exit = p.wait(60s);
    ASSERT_TRUE(exit) << p.err();
    EXPECT_EQ(exit->shell_code(), 128 + sig) << p.err();
    EXPECT_NE(read_file(dir.file("sig.0")).find(sig == SIGINT ? "SIGINT" : "SIGHUP"),
              std::string::npos);
  }
}

TEST(DlaunchSignals, SecondSignalSkipsTheGrace) {
  TempDir dir;
  // A grace far longer than the test waits: only the second SIGTERM can end the job in time.
  Subprocess p(cmd({"--standalone", "--shutdown_grace", "600"},
                   {"ignore-sigterm", "ready=" + dir.path()}));
  ASSERT_TRUE(wait_ready(dir, 1, 30s)) << p.err();
  p.signal(SIGTERM);
  ASSERT_TRUE(wait_until([&] { return p.err().find("received SIGTERM") != std::string::npos; }, 30s));
  p.signal(SIGTERM);
  auto exit = p.wait(60s);
  ASSERT_TRUE(exit) << p.err();
  EXPECT_EQ(exit->shell_code(), 128 + SIGTERM);
  EXPECT_NE(p.err().find("killing the workers now"), std::string::npos) << p.err();
}

// `nohup dlaunch ...`: a SIGHUP the caller ignored stays ignored, in dlaunch and in its workers.
TEST(DlaunchSignals, NohupKeepsSighupIgnoredInDlaunchAndItsWorkers) {
  if (!file_exists("/usr/bin/nohup")) GTEST_SKIP() << "no /usr/bin/nohup";
  TempDir dir;
  std::string ready = dir.file("ready");
  Subprocess p({"/usr/bin/nohup", kDlaunch, "--standalone", "--no_python", "/bin/sh", "-c",
                "grep SigIgn /proc/self/status > " + dir.file("sigign") + "; touch " + ready +
                    "; exec sleep 300"});
  ASSERT_TRUE(wait_until([&] { return file_exists(ready); }, 30s)) << p.err();
  // Lower-numbered pending signals are delivered first: were SIGHUP handled, dlaunch would
  // exit 129 before it saw SIGTERM.
  p.signal(SIGHUP);
  p.signal(SIGTERM);
  auto exit = p.wait(60s);
  ASSERT_TRUE(exit) << p.err();
  EXPECT_EQ(exit->shell_code(), 128 + SIGTERM) << p.err();
  EXPECT_EQ(p.err().find("received SIGHUP"), std::string::npos) << p.err();
  std::string line = read_file(dir.file("sigign"));
  ASSERT_NE(line.find(':'), std::string::npos) << line;
  unsigned long long ignored = std::stoull(line.substr(line.find(':') + 1), nullptr, 16);
  EXPECT_TRUE(ignored & (1ULL << (SIGHUP - 1))) << "worker's " << line;
}

// A second Ctrl-C said "still runs 600.0 s after the stop signal" a second after the first:
// it printed --shutdown_grace, not the time that had passed.
TEST(DlaunchSignals, SecondSignalReportsTheRealElapsedTime) {
  TempDir dir;
  Subprocess p(cmd({"--standalone", "--shutdown_grace", "600"},
                   {"ignore-stop-signals", "ready=" + dir.path()}));
  ASSERT_TRUE(wait_ready(dir, 1, 30s)) << p.err();
  p.signal(SIGINT);
  ASSERT_TRUE(
      wait_until([&] { return p.err().find("received SIGINT") != std::string::npos; }, 30s));
  p.signal(SIGINT);
  auto exit = p.wait(60s);
  ASSERT_TRUE(exit) << p.err();
  EXPECT_EQ(exit->shell_code(), 128 + SIGINT);
  std::string err = p.err();
  // Both lines give the seconds since the first SIGINT; the test waited far less than 600 s.
  for (std::string before : {"received SIGINT again ", "still runs "}) {
    size_t at = err.find(before);
    ASSERT_NE(at, std::string::npos) << before << "\n" << err;
    double seconds = std::stod(err.substr(at + before.size()));
    EXPECT_LT(seconds, 300) << err;
    EXPECT_GE(seconds, 0) << err;
  }
  EXPECT_NE(err.find("s after the stop signal"), std::string::npos) << err;
}

TEST(DlaunchSignals, PreemptionNoticeThenStopExits75) {
  TempDir dir;
  Subprocess p(cmd({"--standalone", "--max_restarts", "3"},
                   {"record-signals", "file=" + dir.file("sig"), "ready=" + dir.path()}));
  ASSERT_TRUE(wait_ready(dir, 1, 30s)) << p.err();
  p.signal(SIGUSR1);
  ASSERT_TRUE(wait_until([&] { return read_file(dir.file("sig.0")).find("SIGUSR1") != std::string::npos; }, 30s));
  p.signal(SIGTERM);
  auto exit = p.wait(60s);
  ASSERT_TRUE(exit) << p.err();
  EXPECT_EQ(exit->shell_code(), 75) << p.err();
}

TEST(DlaunchShutdown, IgnoredSigtermIsBoundedByTheGrace) {
  TempDir dir;
  Subprocess p(cmd({"--standalone", "--nproc_per_node", "2", "--shutdown_grace", "0.5"},
                   {"ignore-sigterm", "ready=" + dir.path()}));
  ASSERT_TRUE(wait_ready(dir, 2, 30s)) << p.err();
  pid_t w0 = std::stoi(read_file(dir.file("ready.0")));
  pid_t w1 = std::stoi(read_file(dir.file("ready.1")));
  p.signal(SIGTERM);
  auto exit = p.wait(60s);
  ASSERT_TRUE(exit) << "dlaunch did not stop workers that ignore SIGTERM\n" << p.err();
  EXPECT_EQ(exit->shell_code(), 128 + SIGTERM);
  EXPECT_NE(p.err().find("sending SIGKILL"), std::string::npos) << p.err();
  EXPECT_TRUE(wait_until([&] { return !process_alive(w0) && !process_alive(w1); }, 10s));
}

TEST(DlaunchOrphans, AgentSigkillTakesGrandchildrenDown) {
  TempDir dir;
  Subprocess p(cmd({"--standalone", "--nproc_per_node", "2"},
                   {"spawn-grandchild", "file=" + dir.file("gc"), "ready=" + dir.path()}));
  ASSERT_TRUE(wait_ready(dir, 2, 30s)) << p.err();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pids.push_back(std::stoi(read_file(dir.file("ready." + std::to_string(r)))));
    pids.push_back(std::stoi(read_file(dir.file("gc." + std::to_string(r)))));
  }
  for (pid_t pid : pids) ASSERT_TRUE(process_alive(pid)) << pid;
  p.signal(SIGKILL);
  ASSERT_TRUE(p.wait(30s));
  for (pid_t pid : pids) {
    EXPECT_TRUE(wait_until([&] { return !process_alive(pid); }, 20s))
        << "pid " << pid << " outlived a SIGKILLed agent";
  }
}

TEST(DlaunchOrphans, FailureCleansUpGrandchildren) {
  TempDir dir;
  // Rank 0 leaves a grandchild behind; rank 1 crashes once rank 0 is ready.
  Subprocess p(cmd({"--standalone", "--nproc_per_node", "2", "--shutdown_grace", "2"},
                   {"spawn-grandchild", "file=" + dir.file("gc"), "ready=" + dir.path(),
                    "rank=0", "others=crash", "others_wait_for=" + dir.file("ready.0")}));
  auto exit = p.wait(60s);
  ASSERT_TRUE(exit) << p.err();
  EXPECT_EQ(exit->shell_code(), 1) << p.err();
  std::string gc = read_file(dir.file("gc.0"));
  ASSERT_FALSE(gc.empty()) << p.err();
  pid_t pid = std::stoi(gc);
  EXPECT_TRUE(wait_until([&] { return !process_alive(pid); }, 10s)) << pid;
}

// A grandchild that left the worker's process group (setsid) is not reached by killpg; it is
// reparented to dlaunch (a child subreaper) when the worker dies, and killed by the sweep.
TEST(DlaunchOrphans, SetsidGrandchildIsSweptWhenTheAttemptEnds) {
  TempDir dir;
  Subprocess p(cmd({"--standalone", "--nproc_per_node", "2", "--shutdown_grace", "2"},
                   {"spawn-grandchild", "setsid=1", "file=" + dir.file("gc"),
                    "ready=" + dir.path(), "rank=0", "others=crash",
                    "others_wait_for=" + dir.file("ready.0")}));
  auto exit = p.wait(60s);
  ASSERT_TRUE(exit) << p.err();
  EXPECT_EQ(exit->shell_code(), 1) << p.err();
  std::string gc = read_file(dir.file("gc.0"));
  ASSERT_FALSE(gc.empty()) << p.err();
  pid_t pid = std::stoi(gc);
  EXPECT_TRUE(wait_until([&] { return !process_alive(pid); }, 10s)) << pid;
  EXPECT_NE(p.err().find("killing orphaned descendant pid " + gc), std::string::npos) << p.err();
}

// A worker that exits 0 leaves a background process (an uploader started with Popen). It was
// SIGKILLed at once and silently; now it gets SIGTERM and --shutdown_grace to end, with a warning.
// An uploader started in the background (Popen) by a worker that then exits 0: it may finish
// within --shutdown_grace, untouched (torchrun does not wait at all; dlaunch leaves no orphan).
TEST(DlaunchOrphans, BackgroundChildOfASuccessfulWorkerMayFinishWithinTheGrace) {
  TempDir dir;
  std::string child = "trap 'echo term > " + dir.file("term") + "; exit 0' TERM; touch " +
                      dir.file("ready") + "; sleep 1; echo uploaded > " + dir.file("done");
  std::string worker = "sh -c \"" + child + "\" & while [ ! -e " + dir.file("ready") +
                       " ]; do sleep 0.01; done; exit 0";
  auto r = run({kDlaunch, "--nproc_per_node", "1", "--master_port", "0", "--shutdown_grace", "60",
                "--no_python", "/bin/sh", "-c", worker},
               {}, 120s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(read_file(dir.file("done")), "uploaded\n") << r.err;
  EXPECT_FALSE(file_exists(dir.file("term"))) << "signalled although it finished\n" << r.err;
  EXPECT_NE(r.err.find("letting them finish for up to 60.0 s"), std::string::npos) << r.err;
}

TEST(DlaunchOrphans, BackgroundChildOfASuccessfulWorkerGetsSigtermAfterTheGrace) {
  TempDir dir;
  std::string child = "trap 'echo term > " + dir.file("term") + "; exit 0' TERM; touch " +
                      dir.file("ready") + "; while :; do sleep 0.05; done";
  std::string worker = "sh -c \"" + child + "\" & while [ ! -e " + dir.file("ready") +
                       " ]; do sleep 0.01; done; exit 0";
  auto r = run({kDlaunch, "--nproc_per_node", "1", "--master_port", "0", "--shutdown_grace", "1",
                "--no_python", "/bin/sh", "-c", worker},
               {}, 120s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(read_file(dir.file("term")), "term\n") << "the background child got no SIGTERM\n"
                                                    << r.err;
  EXPECT_NE(r.err.find("the workers exited 0 but left"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sending SIGTERM, SIGKILL in"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("sending SIGKILL"), std::string::npos) << r.err;
}

TEST(DlaunchOrphans, BackgroundChildIgnoringSigtermIsKilledAfterTheGraceWithAWarning) {
  TempDir dir;
  std::string child = "trap '' TERM; echo \\$$ > " + dir.file("pid.tmp") + "; mv " +
                      dir.file("pid.tmp") + " " + dir.file("pid") +
                      "; while :; do sleep 0.05; done";
  std::string worker = "sh -c \"" + child + "\" & while [ ! -e " + dir.file("pid") +
                       " ]; do sleep 0.01; done; exit 0";
  auto r = run({kDlaunch, "--nproc_per_node", "1", "--master_port", "0", "--shutdown_grace",
                "0.5", "--no_python", "/bin/sh", "-c", worker},
               {}, 120s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  std::string pid = read_file(dir.file("pid"));
  while (!pid.empty() && pid.back() == '\n') pid.pop_back();
  ASSERT_FALSE(pid.empty()) << r.err;
  EXPECT_NE(r.err.find("still run"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("pid " + pid + " (sh -c trap"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sending SIGKILL"), std::string::npos) << r.err;
  EXPECT_TRUE(wait_until([&] { return !process_alive(std::stoi(pid)); }, 10s)) << pid;
}

TEST(DlaunchHang, HungWorkerIsDetectedStackedAndRestarted) {
  TempDir logs;
  auto r = run(cmd({"--standalone", "--hang_timeout", "1", "--hang_timeout_from_start",
                    "--max_restarts", "1", "--shutdown_grace", "1", "--log_dir", logs.path(),
                    "--rdzv_id", "hang"},
                   {"hang"}),
               {}, 120s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(r.err.find("is hung"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restarting the worker group (1 of 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hung      : no heartbeat"), std::string::npos) << r.err;
  if (!file_exists("/usr/bin/eu-stack") && !file_exists("/usr/bin/gdb")) {
    GTEST_SKIP() << "neither eu-stack nor gdb is installed: no stack to check";
  }
  std::string stack = read_file(logs.path() + "/hang/attempt_0/0/stack.txt");
  EXPECT_FALSE(stack.empty()) << r.err;
}

// Issue 13: a program that never heartbeats (it knows nothing of dlaunch) ran into the timeout
// S seconds after its start and was killed as hung.
TEST(DlaunchHang, WorkerThatNeverBeatsIsNotHungUnlessAsked) {
  auto r = run({kDlaunch, "--standalone", "--hang_timeout", "1", "--nproc_per_node", "2",
                "--no_python", "/bin/sleep", "3"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(r.err.find("is hung"), std::string::npos) << r.err;

  r = run({kDlaunch, "--standalone", "--hang_timeout", "1", "--hang_timeout_from_start",
           "--no_python", "/bin/sleep", "30"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(r.err.find("is hung"), std::string::npos) << r.err;
}

// A worker whose only beat comes in its first milliseconds and that then blocks: the file's
// coarse clock could stamp that beat before the recorded start, and the worker was taken for one
// that never beats (never judged).
TEST(DlaunchHang, WorkerThatBeatsOnlyAtItsStartIsHung) {
  for (int i = 0; i < 5; ++i) {
    auto r = run({kDlaunch, "--standalone", "--hang_timeout", "1", "--shutdown_grace", "1",
                  "--nproc_per_node", "2", "--no_python", "/bin/sh", "-c",
                  "touch \"$DLAUNCH_HEARTBEAT_FILE\"; exec sleep 60"},
                 {}, 50s);
    ASSERT_FALSE(r.timed_out) << "try " << i << ": the hang was not detected\n" << r.err;
    EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
    EXPECT_NE(r.err.find("is hung"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("of silence: blocked"), std::string::npos) << r.err;
  }
}

// A silent worker that burns CPU is still stopped at the timeout (a spinning collective burns
// CPU too), and the report says it was busy, so a user with long steps knows what to change.
TEST(DlaunchHang, ASilentWorkerUsingCpuIsReportedAsBusy) {
  auto r = run({kDlaunch, "--standalone", "--hang_timeout", "4", "--shutdown_grace", "1",
                "--no_python", "/bin/sh", "-c",
                "touch \"$DLAUNCH_HEARTBEAT_FILE\"; while :; do :; done"},
               {}, 60s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(r.err.find("is hung"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("busy or spinning; raise --hang_timeout"), std::string::npos) << r.err;
}

TEST(DlaunchHang, BeatingWorkerIsNotHung) {
  // Beats every 50 ms for twice the timeout; the timeout is generous so a busy machine's
  // scheduling gaps cannot look like a hang.
  auto r = run(cmd({"--standalone", "--hang_timeout", "2", "--nproc_per_node", "2"},
                   {"beat", "seconds=4"}));
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(r.err.find("is hung"), std::string::npos) << r.err;
}

// A shell worker's heartbeat loop: `beat N` touches the heartbeat file N times, 50 ms apart.
constexpr const char* kBeatLoop =
    "beat() { i=0; while [ $i -lt $1 ]; do touch \"$DLAUNCH_HEARTBEAT_FILE\"; sleep 0.05; "
    "i=$((i+1)); done; }; ";

// --hang_timeout auto: a worker that beat every 50 ms and then stops is hung after the learned
// timeout (its floor, 1 s), not after the 300 s start-up timeout, and its stack is read first.
TEST(DlaunchHang, AutoDeclaresAWorkerThatStopsBeatingHungByItsLearnedPace) {
  TempDir logs;
  auto r = run({kDlaunch, "--standalone", "--hang_timeout", "auto", "--shutdown_grace", "1",
                "--log_dir", logs.path(), "--rdzv_id", "pace", "--no_python", "/bin/sh", "-c",
                std::string(kBeatLoop) + "beat 80; exec sleep 600"},
               {}, 120s);
  ASSERT_FALSE(r.timed_out) << "the hang was not detected\n" << r.err;
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(r.err.find("is hung"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(--hang_timeout auto: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the longest gap seen"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("start-up timeout"), std::string::npos) << r.err;
  if (!file_exists("/usr/bin/eu-stack") && !file_exists("/usr/bin/gdb")) {
    GTEST_SKIP() << "neither eu-stack nor gdb is installed: no stack to check";
  }
  EXPECT_FALSE(read_file(logs.path() + "/pace/attempt_0/0/stack.txt").empty()) << r.err;
}

// A pause the workers showed while the pace was learned (1 s, like an evaluation, after their
// first 3 gaps) is part of it: a later 2 s pause (past the 1 s floor) is no hang. The pauses
// come early, twice: on a loaded machine the agent sees more of the beats, and the group's 20
// gaps could otherwise be counted before the first pause (which would then be a hang); a check
// that came late does not learn the gap it saw, so one pause could go unlearned.
TEST(DlaunchHang, AutoLearnsALongPauseAndDoesNotDeclareItsRepeatHung) {
  auto r = run({kDlaunch, "--standalone", "--hang_timeout", "auto", "--nproc_per_node", "2",
                "--no_python", "/bin/sh", "-c",
                std::string(kBeatLoop) +
                    "beat 5; sleep 1; beat 2; sleep 1; beat 60; sleep 2; beat 20"},
               {}, 120s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(r.err.find("is hung"), std::string::npos) << r.err;
}

TEST(DlaunchHang, AutoWithABadStartUpTimeoutIsAUsageError) {
  auto r = run({kDlaunch, "--standalone", "--hang_timeout", "auto:0", "--no_python", "/bin/true"});
  EXPECT_EQ(r.exit.shell_code(), 2) << r.err;
  EXPECT_NE(r.err.find("'auto:STARTUP'"), std::string::npos) << r.err;
}

// dlaunch started with its stdin closed (`<&-`, cron, CI): the workers' stdin is /dev/null, not
// whatever file the agent opened first into descriptor 0.
TEST(DlaunchLogs, WorkersOfAnAgentWithoutStdinReadDevNull) {
  auto r = run({"/bin/sh", "-c", "exec \"$0\" \"$@\" <&-", kDlaunch, "--standalone",
                "--nproc_per_node", "2", "--hang_timeout", "30", "--no_python", "/bin/sh", "-c",
                "echo stdin=$(readlink /proc/self/fd/0)"});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.out.find("[default0]:stdin=/dev/null"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[default1]:stdin=/dev/null"), std::string::npos) << r.out;
}

// A tmpfs of `size` mounted on a fresh directory, unmounted on destruction; mounted() is false
// where this process may not mount (not root).
class SmallDisk {
 public:
  explicit SmallDisk(const std::string& size) {
    mounted_ = ::mount("tmpfs", dir_.path().c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  std::string file(const std::string& name) const { return dir_.file(name); }

 private:
  TempDir dir_;
  bool mounted_ = false;
};

size_t count_lines(const std::string& text, const std::string& prefix) {
  return lines_with_prefix(text, prefix).size();
}

// The --log_dir disk fills up: the agent says so at once and at the end, naming the file and
// the error, and the output that the files could not take is on the console, not lost.
TEST(DlaunchLogs, AFullLogDiskIsReportedAndLosesNoOutput) {
  SmallDisk disk("256k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  const std::string lines = "40000";  // ~230 KB per rank: the two ranks cannot both fit
  auto r = run({kDlaunch, "--standalone", "--nproc_per_node", "2", "--log_dir", disk.file("L"),
                "--rdzv_id", "full", "--redirects", "1", "--no_python", "/usr/bin/seq", lines},
               {}, 120s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the file stops here"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("worker output is missing from"), std::string::npos) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    std::string file = read_file(disk.file("L/full/attempt_0/" + std::to_string(rank) +
                                           "/stdout.log"));
    size_t in_file = static_cast<size_t>(std::count(file.begin(), file.end(), '\n'));
    size_t on_console = count_lines(r.out, "[default" + std::to_string(rank) + "]:");
    // The file is an exact prefix, the console has the rest (a line cut by the full disk is in
    // both): every line is somewhere.
    EXPECT_GE(in_file + on_console, 40000u) << "rank " << rank << ": " << in_file << " in the file, "
                                            << on_console << " on the console";
    if (!file.empty()) {
      EXPECT_EQ(file.substr(0, 2), "1\n");
    }
  }
}

std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

// Without --log_dir, the job's directory under $TMPDIR stays only when it holds something that
// can explain the end (output, an error file, a stack), and the log says where it is.
TEST(DlaunchLogs, TheTemporaryWorkerDirectoryStaysOnlyWithSomethingOfValue) {
  {
    TempDir tmp;
    auto r = run({kDlaunch, "--standalone", "--nproc_per_node", "2", "--no_python", "/bin/sh",
                  "-c", "exit 3"},
                 {{"TMPDIR", tmp.path()}});
    EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
    EXPECT_TRUE(entries_of(tmp.path()).empty()) << "left: " << entries_of(tmp.path())[0];
  }
  {
    TempDir tmp;
    Subprocess p({kDlaunch, "--standalone", "--nproc_per_node", "2", "--hang_timeout", "60",
                  "--no_python", "/bin/sleep", "60"},
                 {{"TMPDIR", tmp.path()}});
    ASSERT_TRUE(wait_until([&] { return p.err().find("starting 2 worker") != std::string::npos; },
                           30s))
        << p.err();
    p.signal(SIGTERM);
    auto exit = p.wait(60s);
    ASSERT_TRUE(exit) << p.err();
    EXPECT_EQ(exit->shell_code(), 128 + SIGTERM) << p.err();
    EXPECT_TRUE(entries_of(tmp.path()).empty()) << "left: " << entries_of(tmp.path())[0];
  }
  {
    TempDir tmp;
    auto r = run(cmd({"--standalone"}, {"write-error-file"}), {{"TMPDIR", tmp.path()}});
    EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
    auto left = entries_of(tmp.path());
    ASSERT_EQ(left.size(), 1u) << r.err;
    EXPECT_NE(r.err.find("are kept in " + tmp.path() + "/" + left[0]), std::string::npos) << r.err;
  }
}

TEST(DlaunchLogs, RedirectsTeeFilterAndFiles) {
  TempDir logs;
  auto r = run({kDlaunch, "--standalone", "--nproc_per_node", "2", "--log_dir", logs.path(),
                "--rdzv_id", "logs", "-r", "0:1", "--local_ranks_filter", "0,1", "--no_python",
                "/bin/sh", "-c", "echo out$LOCAL_RANK; echo err$LOCAL_RANK >&2"});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  // Rank 0's stdout is redirected: only in its file. Rank 1's is on the console.
  EXPECT_EQ(r.out.find("[default0]:out0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[default1]:out1"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[default0]:err0"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(logs.path() + "/logs/attempt_0/0/stdout.log"), "out0\n");
  EXPECT_EQ(read_file(logs.path() + "/logs/attempt_0/1/stderr.log"), "err1\n");

  r = run({kDlaunch, "--standalone", "--nproc_per_node", "2", "--local_ranks_filter", "1",
           "/bin/sh", "-c", "echo line$LOCAL_RANK"});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(r.out, "[default1]:line1\n");
}

// Issue 13 item 6: --log_fold prints an identical line of several ranks once, with the ranks
// folded into the prefix; the next, differing lines are printed per rank; the files keep every
// line. The ranks meet before printing, so their identical lines arrive together (a fold waits
// 100 ms for more ranks, then goes out as it is).
TEST(DlaunchLogs, FoldPrintsIdenticalLinesOfSeveralRanksOnceAndFilesKeepEveryLine) {
  TempDir logs, sync;
  std::string script = "touch " + sync.file("r") + "$LOCAL_RANK; while [ $(ls " + sync.path() +
                       " | wc -l) -lt 4 ]; do sleep 0.01; done; echo same; echo rank$LOCAL_RANK";
  auto r = run({kDlaunch, "--standalone", "--nproc_per_node", "4", "--log_fold", "--log_dir",
                logs.path(), "--rdzv_id", "fold", "--no_python", "/bin/sh", "-c", script});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  std::set<int> folded_ranks;
  int same_lines = 0;
  std::smatch m;
  static const std::regex same_re(R"(^\[default([0-9,-]+)\]:same$)");
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (!std::regex_match(line, m, same_re)) continue;
    ++same_lines;
    std::string list = m[1];  // "0-3", "0,2", "1"
    for (size_t at = 0; at < list.size();) {
      size_t end = list.find(',', at);
      if (end == std::string::npos) end = list.size();
      std::string part = list.substr(at, end - at);
      size_t dash = part.find('-');
      int lo = std::stoi(part.substr(0, dash));
      int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
      for (int k = lo; k <= hi; ++k) folded_ranks.insert(k);
      at = end + 1;
    }
  }
  EXPECT_EQ(folded_ranks, (std::set<int>{0, 1, 2, 3})) << r.out;
  EXPECT_LT(same_lines, 4) << "nothing was folded:\n" << r.out;
  for (int k = 0; k < 4; ++k) {
    std::string rank = std::to_string(k);
    EXPECT_NE(r.out.find("[default" + rank + "]:rank" + rank + "\n"), std::string::npos) << r.out;
    EXPECT_EQ(read_file(logs.path() + "/fold/attempt_0/" + rank + "/stdout.log"),
              "same\nrank" + rank + "\n");
  }

  r = run({kDlaunch, "--standalone", "--log_timestamps", "--no_python", "/bin/sh", "-c",
           "echo hello"});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_TRUE(std::regex_match(r.out, std::regex(R"(\d\d:\d\d:\d\d\.\d{3} \[default0\]:hello\n)")))
      << r.out;
}

TEST(DlaunchLogs, TeeWinsOverRedirectFilesAndConsole) {
  TempDir logs;
  auto r = run({kDlaunch, "--standalone", "--log_dir", logs.path(), "--rdzv_id", "tee", "-r", "3",
                "-t", "3", "--no_python", "/bin/sh", "-c", "echo out; echo err >&2"});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.out.find("[default0]:out"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[default0]:err"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(logs.path() + "/tee/attempt_0/0/stdout.log"), "out\n");
  EXPECT_EQ(read_file(logs.path() + "/tee/attempt_0/0/stderr.log"), "err\n");
}

// -r without --log_dir: the output exists only in the files, so they are kept (not deleted with
// the run's temporary directory on success) and dlaunch says where they are.
TEST(DlaunchLogs, RedirectsWithoutLogDirKeepTheFilesAndSayWhere) {
  TempDir tmp;
  auto r = run({kDlaunch, "--standalone", "--rdzv_id", "kept", "-r", "1", "--no_python", "/bin/sh",
                "-c", "echo only-in-the-file"},
               {{"TMPDIR", tmp.path()}});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(r.out.find("only-in-the-file"), std::string::npos) << r.out;
  std::string kept;
  for (const auto& e : std::filesystem::directory_iterator(tmp.path())) {
    if (e.path().filename().string().rfind("dlaunch_kept_", 0) == 0) kept = e.path().string();
  }
  ASSERT_FALSE(kept.empty()) << "the run directory was deleted\n" << r.err;
  EXPECT_EQ(read_file(kept + "/attempt_0/0/stdout.log"), "only-in-the-file\n");
  EXPECT_NE(r.err.find(kept), std::string::npos) << r.err;
}

TEST(DlaunchProgram, LocalRankMacroIsSubstitutedAndDollarDollarKept) {
  auto r = run({kDlaunch, "--standalone", "--nproc_per_node", "2", "--no_python", "/bin/echo",
                "--local_rank=${local_rank}", "cuda:$local_rank", "$$", "$LOCAL_RANK"});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.out.find("[default0]:--local_rank=0 cuda:0 $$ $LOCAL_RANK"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[default1]:--local_rank=1 cuda:1 $$ $LOCAL_RANK"), std::string::npos)
      << r.out;
}

// The run directories directly under `log_dir`.
std::vector<std::string> run_dirs(const std::string& log_dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(log_dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Both jobs had the run id "none" and the same <log_dir>/none/attempt_0: the second deleted the
// first one's logs. Each job now gets its own <run_id>_<random>, as torchrun makes it.
TEST(DlaunchLogs, TwoJobsSharingALogDirKeepTheirOwnRunDirectories) {
  TempDir logs;
  for (std::string word : {"first", "second"}) {
    auto r = run({kDlaunch, "--nproc_per_node", "1", "--master_port", "0", "--log_dir",
                  logs.path(), "--no_python", "/bin/echo", word});
    ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  }
  auto dirs = run_dirs(logs.path());
  ASSERT_EQ(dirs.size(), 2u) << "one run directory per job";
  std::set<std::string> contents;
  for (const auto& d : dirs) {
    EXPECT_EQ(d.rfind("none_", 0), 0u) << d;
    contents.insert(read_file(logs.path() + "/" + d + "/attempt_0/0/stdout.log"));
  }
  EXPECT_EQ(contents, (std::set<std::string>{"first\n", "second\n"}));
}

// A user-chosen run id keeps <log_dir>/<run_id>; a rerun with the same id must not replace
// (or mix into) the earlier run's attempt directories: it gets a fresh name and says so.
TEST(DlaunchLogs, ARerunWithTheSameRdzvIdNeverReplacesTheEarlierLogs) {
  TempDir logs;
  auto first = run({kDlaunch, "--standalone", "--max_restarts", "1", "--log_dir", logs.path(),
                    "--rdzv_id", "job7", "--no_python", "/bin/sh", "-c",
                    "echo first$TORCHELASTIC_RESTART_COUNT; exit $((1 - "
                    "$TORCHELASTIC_RESTART_COUNT))"});
  ASSERT_EQ(first.exit.shell_code(), 0) << first.err;
  auto second = run({kDlaunch, "--standalone", "--log_dir", logs.path(), "--rdzv_id", "job7",
                     "--no_python", "/bin/sh", "-c", "echo second"});
  ASSERT_EQ(second.exit.shell_code(), 0) << second.err;
  EXPECT_EQ(read_file(logs.path() + "/job7/attempt_0/0/stdout.log"), "first0\n");
  EXPECT_EQ(read_file(logs.path() + "/job7/attempt_1/0/stdout.log"), "first1\n");
  auto dirs = run_dirs(logs.path());
  ASSERT_EQ(dirs.size(), 2u);
  EXPECT_EQ(dirs[0], "job7");
  EXPECT_EQ(dirs[1].rfind("job7_", 0), 0u) << dirs[1];
  EXPECT_EQ(read_file(logs.path() + "/" + dirs[1] + "/attempt_0/0/stdout.log"), "second\n");
  EXPECT_FALSE(file_exists(logs.path() + "/" + dirs[1] + "/attempt_1"));
  EXPECT_NE(second.err.find(logs.path() + "/job7 already exists"), std::string::npos)
      << second.err;
  EXPECT_NE(second.err.find("this run writes to " + logs.path() + "/" + dirs[1]),
            std::string::npos)
      << second.err;
}

TEST(DlaunchProgram, AppendLocalRankArgAndPython) {
  auto r = run({kDlaunch, "--standalone", "--nproc_per_node", "2", "--append_local_rank_arg",
                "/bin/echo", "a", "b"});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.out.find("[default1]:--local_rank=1 a b"), std::string::npos) << r.out;

  if (!file_exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  TempDir dir;
  std::string script = dir.file("show.py");
  {
    FILE* f = fopen(script.c_str(), "w");
    fputs("import os, sys\nprint('py', os.environ['RANK'], sys.argv[1:], sys.stdout.write_through)\n",
          f);
    fclose(f);
  }
  r = run({kDlaunch, "--standalone", "--python", "/usr/bin/python3", script, "x"});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  // write_through: python ran with -u, as torchrun runs it.
  EXPECT_NE(r.out.find("[default0]:py 0 ['x'] True"), std::string::npos) << r.out;
}

TEST(DlaunchStore, PortInUseIsAClearMessage) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::string port = std::to_string(ntohs(addr.sin_port));
  auto r = run(cmd({"--master_port", port}, {"ok"}));
  close(fd);
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(r.err.find("127.0.0.1:" + port + ": the port is in use"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

// torchrun's --standalone spelling: c10d on port 0. The agent hosts on a free port and must
// join its own store there, not dial port 0 until the join timeout.
TEST(DlaunchStore, C10dEndpointPortZeroJoinsTheStoreItHosts) {
  auto r = run(cmd({"--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:0",
                    "--rdzv_conf", "join_timeout=20", "--nproc_per_node", "1"},
                   {"ok"}),
               {}, 60s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(lines_with_prefix(r.out, "[default0]:ok rank=0").size(), 1u) << r.out;
  // Several nodes cannot find a port one of them picked: a usage error, at once.
  auto multi = run(cmd({"--nnodes", "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                        "127.0.0.1:0", "--nproc_per_node", "1"},
                       {"ok"}),
                   {}, 60s);
  EXPECT_EQ(multi.exit.shell_code(), 2) << multi.err;
  EXPECT_NE(multi.err.find("port 0"), std::string::npos) << multi.err;
}

// PyTorch workers (Debian's python3-torch 1.13, gloo on CPU) join the agent's store through
// init_method="env://" with TORCHELASTIC_USE_AGENT_STORE=True and all-reduce.
TEST(DlaunchStore, PyTorchWorkersJoinTheAgentStore) {
  auto probe = run({"/usr/bin/python3", "-c", "import torch.distributed"});
  if (probe.timed_out || probe.exit.shell_code() != 0) {
    GTEST_SKIP() << "Debian's python3-torch is not installed for /usr/bin/python3";
  }
  auto r = run({kDlaunch, "--standalone", "--nproc_per_node", "2", "--python", "/usr/bin/python3",
                std::string(SOURCE_DIR) + "/examples/single_node/allreduce.py"},
               {}, 180s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[default0]:rank 0/2: all_reduce sum 1 (restart 0, agent store True)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[default1]:rank 1/2: all_reduce sum 1"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dlaunch::testing
