// PyTorch compatibility: unmodified torchrun-style scripts run under real dlaunch agents on
// 127.0.0.1 (gloo on CPU), each test once with Debian's PyTorch 1.13 (/usr/bin/python3, test
// names ending /Torch113) and once with the pinned PyTorch 2.15 of scripts/setup_torch2.sh's venv
// (/Torch215).
//
//  - 2 agents x 2 workers, static and c10d rendezvous: DDP training ends with bitwise identical
//    parameters on every rank and a lower loss, and every worker used the agent's store
//    (TORCHELASTIC_USE_AGENT_STORE=True): it holds a connection to MASTER_PORT, does not listen on
//    it itself, and the listening socket belongs to the dlaunch agent hosting the store;
//  - a worker decorated with @record that raises: the failure report names the rank and shows the
//    Python exception from TORCHELASTIC_ERROR_FILE;
//  - `-m module` and `script.py` forms (two standalone jobs at once, on separate stores);
//  - elastic 1 -> 2 -> 3 -> 2 agents, a DDP group each round; hangs caught through the optimizer
//    hooks and blamed on the stuck rank (on this node and across nodes);
//  - the workers' whole environment against torchrun's for the same command.
//
// The scripts live beside this file (ddp_train.py, record_fail.py). Skipped, per interpreter,
// when it cannot import torch.distributed. Timeouts are generous: importing torch takes 5-25 s
// (1.13) and up to 30 s (2.15) on the shared 2-core machine.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN;
const std::string kCompatDir = COMPAT_DIR;
const std::string kHooksDir = HOOKS_DIR;  // python/dlaunch_hooks in the source tree
constexpr auto kJobTimeout = 240s;

// An interpreter whose PyTorch the tests run: Debian's 1.13, and the pinned 2.15 of the venv
// scripts/setup_torch2.sh makes (CMake's DLAUNCH_TORCH2_PYTHON).
struct TorchPython {
  std::string name;    // the test name's suffix
  std::string python;  // its interpreter
  std::string setup;   // what makes it, for the skip message
};

// For gtest's and ctest's test lists: the name, not the struct's bytes.
void PrintTo(const TorchPython& p, std::ostream* os) { *os << p.name; }

const TorchPython kTorch113{"Torch113", "/usr/bin/python3",
                            "install python3-torch (scripts/setup.sh --test)"};
const TorchPython kTorch215{"Torch215", DLAUNCH_TORCH2_PYTHON,
                            "run scripts/setup_torch2.sh (scripts/test.sh does)"};

bool torch_missing(const std::string& python) {
  static std::map<std::string, bool> missing;
  auto it = missing.find(python);
  if (it == missing.end()) {
    auto probe = run({python, "-c", "import torch.distributed.elastic.multiprocessing.errors"},
                     {}, 180s);
    it = missing.emplace(python, probe.timed_out || probe.exit.shell_code() != 0).first;
  }
  return it->second;
}

// Every test runs once per interpreter: the same scripts, unmodified.
class TorchCompat : public ::testing::TestWithParam<TorchPython> {
 protected:
  const std::string& python() const { return GetParam().python; }
  bool missing() const { return torch_missing(python()); }
  std::string why_missing() const {
    return python() + " cannot import torch.distributed (" + GetParam().name + "); " +
           GetParam().setup;
  }
  std::vector<std::string> agent_argv(std::vector<std::string> flags,
                                      const std::vector<std::string>& program) const {
    flags.insert(flags.begin(), kDlaunch);
    flags.insert(flags.end(), {"--python", python()});
    flags.insert(flags.end(), program.begin(), program.end());
    return flags;
  }
};

#define SKIP_WITHOUT_TORCH() \
  if (missing()) GTEST_SKIP() << why_missing()

// What ddp_train.py printed for one rank.
struct RankReport {
  int world = 0;
  int store_port = 0;
  int listen_self = -1;
  int connected = -1;
  long owner_pid = 0;
  std::string agent_store;
  double loss_first = 0;
  double loss_last = 0;
  int steps = 0;
  std::string sha;
};

std::map<int, RankReport> parse_reports(const std::string& out) {
  static const std::regex store_re(
      R"(rank (\d+)/(\d+): store port=(\d+) listen_self=(\d) connected=(\d) owner_pid=(\d+) )"
      R"(agent_store=(\S*))");
  static const std::regex loss_re(R"(rank (\d+)/(\d+): loss ([0-9.]+) -> ([0-9.]+) steps=(\d+))");
  static const std::regex sha_re(R"(rank (\d+)/(\d+): params sha256 ([0-9a-f]{64}))");
  std::map<int, RankReport> reports;
  std::smatch m;
  size_t pos = 0;
  while (pos < out.size()) {
    size_t end = out.find('\n', pos);
    if (end == std::string::npos) end = out.size();
    std::string line = out.substr(pos, end - pos);
    pos = end + 1;
    if (std::regex_search(line, m, store_re)) {
      auto& r = reports[std::stoi(m[1])];
      r.world = std::stoi(m[2]);
      r.store_port = std::stoi(m[3]);
      r.listen_self = std::stoi(m[4]);
      r.connected = std::stoi(m[5]);
      r.owner_pid = std::stol(m[6]);
      r.agent_store = m[7];
    } else if (std::regex_search(line, m, loss_re)) {
      auto& r = reports[std::stoi(m[1])];
      r.loss_first = std::stod(m[3]);
      r.loss_last = std::stod(m[4]);
      r.steps = std::stoi(m[5]);
    } else if (std::regex_search(line, m, sha_re)) {
      reports[std::stoi(m[1])].sha = m[3];
    }
  }
  return reports;
}

// Every rank 0..world-1 reported, trained `steps` steps, ends with the same parameters, and the
// (rank-averaged) loss went down.
void expect_trained_together(const std::map<int, RankReport>& reports, int world, int steps,
                             const std::string& context) {
  ASSERT_EQ(reports.size(), static_cast<size_t>(world)) << context;
  const std::string& sha0 = reports.begin()->second.sha;
  EXPECT_EQ(sha0.size(), 64u) << context;
  for (const auto& [rank, r] : reports) {
    EXPECT_GE(rank, 0);
    EXPECT_LT(rank, world) << context;
    EXPECT_EQ(r.world, world) << "rank " << rank << "\n" << context;
    EXPECT_EQ(r.steps, steps) << "rank " << rank << "\n" << context;
    EXPECT_EQ(r.sha, sha0) << "rank " << rank << " ended with different parameters\n" << context;
    EXPECT_GT(r.loss_first, 0.0) << context;
    EXPECT_LT(r.loss_last, r.loss_first * 0.9)
        << "rank " << rank << ": the loss did not go down\n" << context;
  }
}

// Every worker reached the store hosted by `host_pid` at `port` as a client only.
void expect_on_agent_store(const std::map<int, RankReport>& reports, int port, long host_pid,
                           const std::string& context) {
  for (const auto& [rank, r] : reports) {
    EXPECT_EQ(r.agent_store, "True") << "rank " << rank << "\n" << context;
    EXPECT_EQ(r.store_port, port) << "rank " << rank << "\n" << context;
    EXPECT_EQ(r.listen_self, 0) << "rank " << rank << " listens on MASTER_PORT itself\n"
                                << context;
    EXPECT_EQ(r.connected, 1) << "rank " << rank << " holds no connection to MASTER_PORT\n"
                              << context;
    EXPECT_EQ(r.owner_pid, host_pid)
        << "rank " << rank << ": MASTER_PORT is not the hosting agent's listener\n"
        << context;
  }
}

struct JobResult {
  std::string out;      // every agent's stdout, concatenated
  std::string context;  // every agent's stdout and stderr, for failure messages
};

// Waits for every agent; each must exit with `expected_code`.
JobResult wait_all(std::vector<std::unique_ptr<Subprocess>>& agents, int expected_code) {
  JobResult job;
  for (size_t i = 0; i < agents.size(); ++i) {
    auto e = agents[i]->wait(kJobTimeout);
    job.out += agents[i]->out();
    job.context += "--- agent " + std::to_string(i) + " stdout:\n" + agents[i]->out() +
                   "--- agent " + std::to_string(i) + " stderr:\n" + agents[i]->err();
    EXPECT_TRUE(e) << "agent " << i << " did not exit within " << kJobTimeout.count() << " s";
    if (e) {
      EXPECT_EQ(e->shell_code(), expected_code) << "agent " << i;
    }
  }
  return job;
}

// (a) and (e): static rendezvous, node 0 hosts the store at --master_port.
TEST_P(TorchCompat, StaticTwoAgentsDdpOnAgentStore) {
  SKIP_WITHOUT_TORCH();
  int port = free_port();
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (const char* rank : {"0", "1"}) {
    agents.push_back(std::make_unique<Subprocess>(agent_argv(
        {"--nnodes", "2", "--node_rank", rank, "--master_addr", "127.0.0.1", "--master_port",
         std::to_string(port), "--nproc_per_node", "2", "--rdzv_id", "compat_static"},
        {kCompatDir + "/ddp_train.py", "--steps", "8"})));
  }
  auto job = wait_all(agents, 0);
  auto reports = parse_reports(job.out);
  expect_trained_together(reports, 4, 8, job.context);
  expect_on_agent_store(reports, port, agents[0]->pid(), job.context);
}

// (b) and (e): c10d elastic rendezvous at MIN=MAX=2; the agent that bound the endpoint hosts the
// store and the workers use it (MASTER_PORT = the endpoint's port).
TEST_P(TorchCompat, ElasticC10dTwoAgentsDdpOnAgentStore) {
  SKIP_WITHOUT_TORCH();
  int port = free_port();
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<Subprocess>(agent_argv(
        {"--nnodes", "2:2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
         "127.0.0.1:" + std::to_string(port), "--rdzv_id", "compat_c10d", "--nproc_per_node",
         "2"},
        {kCompatDir + "/ddp_train.py", "--steps", "8"})));
  }
  auto job = wait_all(agents, 0);
  auto reports = parse_reports(job.out);
  expect_trained_together(reports, 4, 8, job.context);
  long host = 0;
  for (auto& a : agents) {
    if (a->err().find("hosting the job's store") != std::string::npos) host = a->pid();
  }
  ASSERT_NE(host, 0) << "no agent said it hosts the store\n" << job.context;
  expect_on_agent_store(reports, port, host, job.context);
}

// --store_proxy on: each node's workers reach the job's store through their own agent (MASTER_PORT
// names the node's proxy, not the endpoint), and the job trains to the same parameters as with
// the proxy off, in both PyTorch dialects.
TEST_P(TorchCompat, ElasticC10dTwoAgentsTrainTheSameThroughTheStoreProxy) {
  SKIP_WITHOUT_TORCH();
  std::map<std::string, std::map<int, RankReport>> by_mode;
  for (const std::string mode : {"off", "on"}) {
    SCOPED_TRACE("--store_proxy " + mode);
    int port = free_port();
    std::vector<std::unique_ptr<Subprocess>> agents;
    for (int i = 0; i < 2; ++i) {
      agents.push_back(std::make_unique<Subprocess>(agent_argv(
          {"--nnodes", "2:2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
           "127.0.0.1:" + std::to_string(port), "--rdzv_id", "compat_proxy_" + mode,
           "--nproc_per_node", "2", "--store_proxy", mode},
          {kCompatDir + "/ddp_train.py", "--steps", "8"})));
    }
    auto job = wait_all(agents, 0);
    auto reports = parse_reports(job.out);
    expect_trained_together(reports, 4, 8, job.context);
    std::set<long> agent_pids{agents[0]->pid(), agents[1]->pid()};
    for (const auto& [rank, r] : reports) {
      EXPECT_EQ(r.agent_store, "True") << "rank " << rank << "\n" << job.context;
      EXPECT_EQ(r.listen_self, 0) << "rank " << rank << "\n" << job.context;
      EXPECT_EQ(r.connected, 1) << "rank " << rank << "\n" << job.context;
      EXPECT_TRUE(agent_pids.count(r.owner_pid)) << "rank " << rank << "\n" << job.context;
      if (mode == "on") {
        EXPECT_NE(r.store_port, port) << "rank " << rank << " talks to the store directly\n"
                                      << job.context;
      } else {
        EXPECT_EQ(r.store_port, port) << "rank " << rank << "\n" << job.context;
      }
    }
    if (mode == "on") {
      int proxies = 0;
      for (auto& a : agents) proxies += a->err().find("store proxy: this node's workers") != std::string::npos;
      EXPECT_EQ(proxies, 2) << job.context;
    }
    by_mode[mode] = reports;
  }
  ASSERT_EQ(by_mode["on"].size(), by_mode["off"].size());
  for (const auto& [rank, r] : by_mode["on"]) {
    EXPECT_EQ(r.sha, by_mode["off"][rank].sha) << "rank " << rank << " trained differently";
    EXPECT_EQ(r.loss_last, by_mode["off"][rank].loss_last) << "rank " << rank;
  }
}

// A node joining a running c10d job (1 -> 2 -> 3 agents) and one leaving (3 -> 2, SIGTERM to
// its agent): each membership change restarts every worker with the new WORLD_SIZE and keeps
// TORCHELASTIC_RESTART_COUNT, so PyTorch's "/worker/attempt_0/" keys repeat; each round's
// workers must still form a working DDP group (they read a previous round's gloo addresses
// before rounds had a store namespace of their own: "address.cc:45 ... 136 vs 0", or a hang).
// With --max_restarts 0: no membership change may spend the budget, also not the leave, whose
// peers' workers fail at once (gloo: connection closed by peer).
TEST_P(TorchCompat, ElasticScaleUpAndDownFormsAWorkingDdpGroupEachRound) {
  SKIP_WITHOUT_TORCH();
  TempDir dir;
  const std::string stop = dir.file("stop");
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> agents;
  auto add_agent = [&](const std::string& local_addr) {
    agents.push_back(std::make_unique<Subprocess>(agent_argv(
        {"--nnodes", "1:3", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id",
         "compat_scale", "--rdzv_conf", "last_call_timeout=2", "--max_restarts", "0",
         "--local_addr", local_addr},
        {kCompatDir + "/elastic_ddp.py", stop})));
  };
  auto context = [&] {
    std::string text;
    for (size_t i = 0; i < agents.size(); ++i) {
      text += "--- agent " + std::to_string(i) + " stdout:\n" + agents[i]->out() + "--- agent " +
              std::to_string(i) + " stderr:\n" + agents[i]->err();
    }
    return text;
  };
  // Every rank of a `world`-rank group has stepped, in output written after `since` (per agent).
  auto stepping = [&](int world, const std::vector<size_t>& since) {
    return wait_until(
        [&] {
          for (int rank = 0; rank < world; ++rank) {
            std::string line = "rank " + std::to_string(rank) + "/" + std::to_string(world) + ": step";
            bool seen = false;
            for (size_t i = 0; i < agents.size() && !seen; ++i) {
              size_t from = i < since.size() ? since[i] : 0;
              seen = agents[i]->out().find(line, from) != std::string::npos;
            }
            if (!seen) return false;
          }
          return true;
        },
        180s);
  };
  add_agent("127.0.0.1");
  ASSERT_TRUE(stepping(1, {})) << context();
  add_agent("127.0.0.2");
  ASSERT_TRUE(stepping(2, {})) << "no working group of 2 after a node joined\n" << context();
  add_agent("127.0.0.3");
  ASSERT_TRUE(stepping(3, {})) << "no working group of 3 after a node joined\n" << context();
  std::vector<size_t> before_leave;
  for (auto& a : agents) before_leave.push_back(a->out().size());
  agents[2]->signal(SIGTERM);
  ASSERT_TRUE(stepping(2, before_leave)) << "no working group of 2 after a node left\n" << context();
  { std::ofstream touch(stop); }
  for (size_t i = 0; i < 2; ++i) {
    auto e = agents[i]->wait(kJobTimeout);
    ASSERT_TRUE(e) << "agent " << i << " did not finish\n" << context();
    EXPECT_EQ(e->shell_code(), 0) << "agent " << i << "\n" << context();
  }
  EXPECT_TRUE(agents[2]->wait(kJobTimeout)) << context();
}

// (c): rank 1 (node 1's only worker) raises inside @record. Node 1's report names the rank and
// shows the exception from the error file (the `traceback :` field appears only when the error
// file was read; otherwise the report shows the stderr tail). Node 0 is told by the push.
TEST_P(TorchCompat, RecordedExceptionReachesFailureReport) {
  SKIP_WITHOUT_TORCH();
  std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (const char* rank : {"0", "1"}) {
    agents.push_back(std::make_unique<Subprocess>(
        agent_argv({"--nnodes", "2", "--node_rank", rank, "--master_port", port, "--rdzv_id",
                    "compat_record"},
                   {kCompatDir + "/record_fail.py"}),
        std::map<std::string, std::string>{{"COMPAT_FAIL_RANK", "1"}}));
  }
  auto job = wait_all(agents, 1);
  std::string err1 = agents[1]->err();
  size_t report = err1.find("Root cause (first observed failure):");
  ASSERT_NE(report, std::string::npos) << job.context;
  std::string summary = err1.substr(report);
  EXPECT_TRUE(std::regex_search(summary, std::regex(R"(rank\s*:\s*1 \(local_rank: 0\))")))
      << summary;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(summary, m, std::regex(R"(error_file:\s*(\S+))"))) << summary;
  EXPECT_NE(m[1].str(), "<N/A>") << summary;
  EXPECT_NE(m[1].str().find("error.json"), std::string::npos) << summary;
  EXPECT_TRUE(std::regex_search(
      summary,
      std::regex(R"(traceback\s*:\s*ValueError: compat: deliberate failure on rank 1 of 2)")))
      << summary;
  // The other node stopped its worker because of the push, and says whose failure it was.
  std::string err0 = agents[0]->err();
  EXPECT_NE(err0.find("rank 1"), std::string::npos) << err0;
  EXPECT_EQ(err0.find("deliberate failure"), std::string::npos)
      << "node 0's own worker did not fail; its report should not claim it did\n"
      << err0;
}

// (d): the same script as `-m ddp_train` (found through PYTHONPATH) and as a path, two
// standalone jobs at the same time: each gets its own store (port), its arguments, and trains.
TEST_P(TorchCompat, ModuleAndScriptFormsAsTwoStandaloneJobs) {
  SKIP_WITHOUT_TORCH();
  std::map<std::string, std::string> env{{"PYTHONPATH", kCompatDir}};
  std::vector<std::unique_ptr<Subprocess>> jobs;
  jobs.push_back(std::make_unique<Subprocess>(
      agent_argv({"--standalone", "--nproc_per_node", "2"}, {"-m", "ddp_train", "--steps", "5"}),
      env));
  jobs.push_back(std::make_unique<Subprocess>(
      agent_argv({"--standalone", "--nproc_per_node", "2"},
                 {kCompatDir + "/ddp_train.py", "--steps", "6"})));
  std::set<int> ports;
  for (size_t i = 0; i < jobs.size(); ++i) {
    std::vector<std::unique_ptr<Subprocess>> one;
    one.push_back(std::move(jobs[i]));
    auto job = wait_all(one, 0);
    auto reports = parse_reports(job.out);
    expect_trained_together(reports, 2, i == 0 ? 5 : 6, job.context);
    ASSERT_FALSE(reports.empty());
    int port = reports.begin()->second.store_port;
    expect_on_agent_store(reports, port, one[0]->pid(), job.context);
    ports.insert(port);
  }
  EXPECT_EQ(ports.size(), 2u) << "two standalone jobs shared one store port";
}

// (f) issue 13: dlaunch's sitecustomize runs the user's own sitecustomize (the one it shadows on
// PYTHONPATH), does not import torch for a script that does not, and --no_python_hooks leaves it
// out. Needs only the interpreter, not torch.
TEST_P(TorchCompat, PythonHooksKeepTheUsersSitecustomizeAndImportNothing) {
  if (::access(python().c_str(), X_OK) != 0) GTEST_SKIP() << why_missing();
  TempDir user;
  std::ofstream(user.file("sitecustomize.py")) << "import builtins\nbuiltins.compat_user_site = 'mine'\n";
  std::map<std::string, std::string> env{{"PYTHONPATH", user.path()}};
  for (bool hooks : {true, false}) {
    std::vector<std::string> flags{"--standalone"};
    if (!hooks) flags.push_back("--no_python_hooks");
    auto r = run(agent_argv(flags, {kCompatDir + "/hooks_probe.py"}), env, kJobTimeout);
    ASSERT_FALSE(r.timed_out) << r.err;
    ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
    EXPECT_NE(r.out.find("torch_imported=0 user_sitecustomize=mine"), std::string::npos)
        << "hooks=" << hooks << "\n" << r.out << r.err;
    EXPECT_EQ(r.out.find("stack_file=-") == std::string::npos, hooks) << r.out;
  }
}

// (f') issue 13: the optimizer heartbeats inside one interpreter (hooks_selftest.py): the real
// PyTorch (1.13: per-class step wrapping, wrapped once; 2.15: the global step post hook, nothing
// wrapped; both: SGD and Adam beat, at most every 100 ms), and a stand-in package with PyTorch
// 2.x's global step post hook.
TEST_P(TorchCompat, OptimizerStepsHeartbeatThroughTheHooks) {
  TempDir dir;
  for (const char* mode : {"fake2", "real"}) {
    if (std::string(mode) == "real" && missing()) continue;
    std::map<std::string, std::string> env{{"PYTHONPATH", kHooksDir},
                                           {"DLAUNCH_HEARTBEAT_FILE", dir.file(mode)}};
    auto r = run({python(), kCompatDir + "/hooks_selftest.py", mode}, env, kJobTimeout);
    ASSERT_FALSE(r.timed_out) << mode;
    EXPECT_EQ(r.exit.shell_code(), 0) << mode << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("selftest ok"), std::string::npos) << mode << "\n" << r.out << r.err;
  }
}

// (g) issue 13: an unmodified DDP script (ddp_hang.py: nothing in it knows dlaunch) in which
// rank 1 blocks forever at step 5. dlaunch's sitecustomize heartbeats on every optimizer step,
// so --hang_timeout sees the stop; rank 0, blocked in DDP's all-reduce, goes silent too, and the
// stacks must name rank 1 (the old report named rank 0, the first by index). Both attempts
// hang, so the group is restarted once and the final report is printed.
TEST_P(TorchCompat, HangInAnUnmodifiedDdpScriptIsCaughtAndBlamedOnTheStuckRank) {
  SKIP_WITHOUT_TORCH();
  TempDir logs;
  auto r = run(agent_argv({"--standalone", "--nproc_per_node", "2", "--hang_timeout", "4",
                           "--max_restarts", "1", "--shutdown_grace", "2", "--log_dir",
                           logs.path(), "--rdzv_id", "hang"},
                          {kCompatDir + "/ddp_hang.py"}),
               {{"COMPAT_HANG_ATTEMPTS", "2"}}, kJobTimeout);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(r.out.find("rank 1: stuck now"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("is hung"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restarting the worker group (1 of 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("root cause of the hang: local rank 1 (rank 1"), std::string::npos) << r.err;
  size_t report = r.err.rfind("Root cause (first observed failure):");
  ASSERT_NE(report, std::string::npos) << r.err;
  std::string summary = r.err.substr(report);
  EXPECT_TRUE(std::regex_search(summary, std::regex(R"(rank\s*:\s*1 \(local_rank: 1\))")))
      << summary;
  EXPECT_TRUE(std::regex_search(
      summary, std::regex(R"(stuck in\s*:\s*wait_for_a_batch_that_never_comes \(ddp_hang.py:)")))
      << summary;
  EXPECT_NE(summary.find("line 22 in wait_for_a_batch_that_never_comes"), std::string::npos)
      << summary;
  for (const char* attempt : {"attempt_0", "attempt_1"}) {
    std::string dir = logs.path() + "/hang/" + attempt;
    EXPECT_NE(read_file(dir + "/1/py_stack.txt").find("in wait_for_a_batch_that_never_comes"),
              std::string::npos)
        << dir;
    // Rank 0 waits in DDP's backward all-reduce: said so, not blamed.
    EXPECT_NE(read_file(dir + "/0/py_stack.txt").find("in backward"), std::string::npos) << dir;
  }
  EXPECT_NE(r.err.find("local rank 0 (rank 0, silent): waits in a collective"), std::string::npos)
      << r.err;
  if (file_exists("/usr/bin/eu-stack") || file_exists("/usr/bin/gdb")) {
    EXPECT_NE(read_file(logs.path() + "/hang/attempt_0/0/stack.txt").find("c10d::"),
              std::string::npos);
  }
}

// (h) issue 13, across nodes: two agents (two "nodes" on this host, one worker each); rank 1,
// on node 1, blocks forever. Node 0's rank only waits for it in DDP's all-reduce, so node 0
// alone could only name its own victim: the nodes compare their verdicts through the job's
// store (launcher/hang/hang_exchange.h) and node 0's report names node 1's rank 1, where it is
// stuck and its Python stack, and calls its own rank a victim.
TEST_P(TorchCompat, HangOfARankOnAnotherNodeIsBlamedOnItByEveryNode) {
  SKIP_WITHOUT_TORCH();
  TempDir logs;
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (const char* rank : {"0", "1"}) {
    agents.push_back(std::make_unique<Subprocess>(
        agent_argv({"--nnodes", "2", "--node_rank", rank, "--master_addr", "127.0.0.1",
                    "--master_port", port, "--nproc_per_node", "1", "--hang_timeout", "4",
                    "--max_restarts", "0", "--shutdown_grace", "2", "--log_dir",
                    logs.path() + "/node" + rank, "--rdzv_id", "xhang"},
                   {kCompatDir + "/ddp_hang.py"}),
        std::map<std::string, std::string>{{"COMPAT_HANG_RANK", "1"}}));
  }
  auto job = wait_all(agents, 1);
  EXPECT_NE(job.out.find("rank 1: stuck now"), std::string::npos) << job.context;
  for (size_t node = 0; node < agents.size(); ++node) {
    const std::string err = agents[node]->err();
    size_t report = err.rfind("Root cause");
    ASSERT_NE(report, std::string::npos) << "node " << node << ":\n" << job.context;
    const std::string summary = err.substr(report);
    EXPECT_TRUE(std::regex_search(summary, std::regex(R"(rank\s*:\s*1 \(local_rank: 0\))")))
        << "node " << node << ":\n" << summary;
    EXPECT_TRUE(std::regex_search(
        summary,
        std::regex(R"(stuck in\s*:\s*wait_for_a_batch_that_never_comes \(ddp_hang.py:)")))
        << "node " << node << ":\n" << summary;
    EXPECT_NE(summary.find("line 22 in wait_for_a_batch_that_never_comes"), std::string::npos)
        << "node " << node << ":\n" << summary;
  }
  const std::string node0 = agents[0]->err();
  EXPECT_NE(node0.find("root cause of the hang: rank 1 on node 1"), std::string::npos) << node0;
  size_t report = node0.rfind("Root cause");
  ASSERT_NE(report, std::string::npos) << node0;
  EXPECT_NE(node0.find("a rank stuck on another node", report), std::string::npos) << node0;
  EXPECT_NE(node0.find("Workers on this node (its victims", report), std::string::npos) << node0;
  EXPECT_NE(read_file(logs.path() + "/node0/xhang/attempt_0/0/py_stack.txt").find("in backward"),
            std::string::npos);
}

// The same hang, but node 1's agent sees it first by far (its --hang_timeout is half node 0's):
// its restart request reaches node 0 while node 0's rank is silent but not yet past its own
// timeout, which under load happened with equal timeouts too. Node 0 reads its rank's stacks
// and the nodes' hang verdicts before it stops, and its report names node 1's stuck rank as
// node 1's does, not "restart requested by another node".
TEST_P(TorchCompat, HangOfARankOnAnotherNodeIsBlamedOnItByANodeThatHadNotSeenTheHangYet) {
  SKIP_WITHOUT_TORCH();
  TempDir logs;
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (const char* rank : {"0", "1"}) {
    const std::string hang_timeout = std::string(rank) == "0" ? "8" : "4";
    agents.push_back(std::make_unique<Subprocess>(
        agent_argv({"--nnodes", "2", "--node_rank", rank, "--master_addr", "127.0.0.1",
                    "--master_port", port, "--nproc_per_node", "1", "--hang_timeout",
                    hang_timeout, "--max_restarts", "0", "--shutdown_grace", "2", "--log_dir",
                    logs.path() + "/node" + rank, "--rdzv_id", "xhangpeer"},
                   {kCompatDir + "/ddp_hang.py"}),
        std::map<std::string, std::string>{{"COMPAT_HANG_RANK", "1"}}));
  }
  auto job = wait_all(agents, 1);
  EXPECT_NE(job.out.find("rank 1: stuck now"), std::string::npos) << job.context;
  const std::string node0 = agents[0]->err();
  EXPECT_NE(node0.find("(half --hang_timeout): reading their stacks"), std::string::npos)
      << node0;
  EXPECT_EQ(node0.find("is hung"), std::string::npos) << "node 0 saw the hang itself:\n" << node0;
  EXPECT_NE(node0.find("root cause of the hang: rank 1 on node 1"), std::string::npos) << node0;
  size_t report = node0.rfind("Root cause");
  ASSERT_NE(report, std::string::npos) << node0;
  const std::string summary = node0.substr(report);
  EXPECT_NE(summary.find("a rank stuck on another node"), std::string::npos) << summary;
  EXPECT_TRUE(std::regex_search(summary, std::regex(R"(rank\s*:\s*1 \(local_rank: 0\))")))
      << summary;
  EXPECT_NE(summary.find("line 22 in wait_for_a_batch_that_never_comes"), std::string::npos)
      << summary;
  EXPECT_NE(summary.find("Workers on this node (its victims"), std::string::npos) << summary;
  const std::string stack = read_file(logs.path() + "/node0/xhangpeer/attempt_0/0/py_stack.txt");
  EXPECT_NE(stack.find("in backward"), std::string::npos) << stack;
}

// The whole environment of the same command's workers under torchrun (`python -m
// torch.distributed.run` of the interpreter) and under dlaunch, variable by variable: every
// difference is one of those listed here and in docs/env.md ("Where dlaunch differs from
// torchrun"), and every other variable, inherited ones included, is byte-for-byte the same.
// Both get --redirects 1 --tee 1: Debian's torchrun 1.13 fails on Python 3.11 with the default
// 0 (its Std.from_str("0") finds no flag and returns None).
enum class Differs { kValue, kDlaunchOnly, kTorchrunOnly };
struct EnvDifference {
  std::string name;
  Differs how;
};

std::vector<EnvDifference> documented_env_differences(const std::string& version) {
  std::vector<EnvDifference> d = {
      {"MASTER_ADDR", Differs::kValue},       // torchrun: its FQDN; dlaunch: its store's address
      {"MASTER_PORT", Differs::kValue},       // a free port each
      {"TORCHELASTIC_RUN_ID", Differs::kValue},      // random: a UUID; 16 hex digits
      {"TORCHELASTIC_ERROR_FILE", Differs::kValue},  // each launcher's own directory
      {"OMP_NUM_THREADS", Differs::kValue},   // torchrun: 1; dlaunch: cores / nproc
      {"PYTHONPATH", Differs::kValue},        // dlaunch's hooks first
      {"DLAUNCH_ATTEMPT", Differs::kDlaunchOnly},
      {"DLAUNCH_FLASH_DIR", Differs::kDlaunchOnly},
      {"DLAUNCH_HEARTBEAT_FILE", Differs::kDlaunchOnly},
      {"DLAUNCH_NODE_ID", Differs::kDlaunchOnly},
      {"DLAUNCH_PY_STACK_FILE", Differs::kDlaunchOnly},
      {"DLAUNCH_PY_STACK_SIGNAL", Differs::kDlaunchOnly},
      {"DLAUNCH_RECOVERY_KEY", Differs::kDlaunchOnly},  // --restart_scope rank (the default)
      {"DLAUNCH_SHUTDOWN_GRACE", Differs::kDlaunchOnly},
  };
  if (version == "Torch113") {
    d.push_back({"TORCHELASTIC_USE_AGENT_STORE", Differs::kValue});  // 1.13: False unless static
    d.push_back({"TORCH_NCCL_ASYNC_ERROR_HANDLING", Differs::kDlaunchOnly});  // 2.x's name
    d.push_back({"TORCHELASTIC_SIGNALS_TO_HANDLE", Differs::kDlaunchOnly});   // 2.x's flag
  } else {
    d.push_back({"NCCL_ASYNC_ERROR_HANDLING", Differs::kDlaunchOnly});  // 1.x's name
  }
  return d;
}

std::map<std::string, std::string> read_env_dump(const std::string& path) {
  std::map<std::string, std::string> env;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

TEST_P(TorchCompat, WorkerEnvironmentIsTorchrunsButForTheDocumentedDifferences) {
  SKIP_WITHOUT_TORCH();
  TempDir dir;
  const std::vector<std::string> common = {"--nproc_per_node", "2", "--standalone",
                                           "--redirects", "1", "--tee", "1"};
  // The same inherited environment for both, PYTHONPATH included (dlaunch prepends to it).
  const std::map<std::string, std::string> env{{"PYTHONPATH", dir.path() + "/nothing_here"}};
  std::map<std::string, std::map<std::string, std::string>> dumps[2];
  for (int launcher = 0; launcher < 2; ++launcher) {
    const std::string out = dir.file(launcher == 0 ? "torchrun" : "dlaunch");
    ASSERT_EQ(::mkdir(out.c_str(), 0700), 0);
    std::vector<std::string> flags = common;
    flags.insert(flags.end(), {"--log_dir", out + "_logs"});
    std::vector<std::string> argv;
    if (launcher == 0) {
      argv = {python(), "-m", "torch.distributed.run"};
      argv.insert(argv.end(), flags.begin(), flags.end());
      argv.insert(argv.end(), {kCompatDir + "/env_dump.py", out});
    } else {
      argv = agent_argv(flags, {kCompatDir + "/env_dump.py", out});
    }
    auto r = run(argv, env, kJobTimeout);
    ASSERT_FALSE(r.timed_out) << argv[0] << "\n" << r.err;
    ASSERT_EQ(r.exit.shell_code(), 0) << argv[0] << "\n" << r.out << r.err;
    for (const char* rank : {"0", "1"}) {
      dumps[launcher][rank] = read_env_dump(out + "/env." + rank);
      ASSERT_FALSE(dumps[launcher][rank].empty()) << out << " rank " << rank;
    }
  }
  const auto documented = documented_env_differences(GetParam().name);
  auto listed = [&](const std::string& name, Differs how) {
    return std::any_of(documented.begin(), documented.end(),
                       [&](const auto& d) { return d.name == name && d.how == how; });
  };
  for (const char* rank : {"0", "1"}) {
    const auto& torchrun = dumps[0][rank];
    const auto& dlaunch = dumps[1][rank];
    SCOPED_TRACE(std::string("rank ") + rank);
    std::set<std::string> names;
    for (const auto& [k, v] : torchrun) names.insert(k);
    for (const auto& [k, v] : dlaunch) names.insert(k);
    for (const auto& name : names) {
      auto t = torchrun.find(name), d = dlaunch.find(name);
      if (t == torchrun.end()) {
        EXPECT_TRUE(listed(name, Differs::kDlaunchOnly))
            << name << "=" << d->second << " is set by dlaunch only, and not documented so";
      } else if (d == dlaunch.end()) {
        EXPECT_TRUE(listed(name, Differs::kTorchrunOnly))
            << name << "=" << t->second << " is set by torchrun only, and not documented so";
      } else if (t->second != d->second) {
        EXPECT_TRUE(listed(name, Differs::kValue))
            << name << ": torchrun " << t->second << ", dlaunch " << d->second
            << ", and not documented as differing";
      }
    }
    // What is documented as present on one side only is so (the list is not stale).
    for (const auto& doc : documented) {
      if (doc.how == Differs::kDlaunchOnly) {
        EXPECT_TRUE(dlaunch.count(doc.name) && !torchrun.count(doc.name)) << doc.name;
      } else if (doc.how == Differs::kTorchrunOnly) {
        EXPECT_TRUE(torchrun.count(doc.name) && !dlaunch.count(doc.name)) << doc.name;
      }
    }
    // The hooks are prepended; the rest is the inherited value.
    const std::string inherited = ":" + torchrun.at("PYTHONPATH");
    const std::string& ours = dlaunch.at("PYTHONPATH");
    EXPECT_TRUE(ours.size() > inherited.size() &&
                ours.compare(ours.size() - inherited.size(), inherited.size(), inherited) == 0)
        << ours;
  }
}

INSTANTIATE_TEST_SUITE_P(Interpreters, TorchCompat, ::testing::Values(kTorch113, kTorch215),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace dlaunch::testing
