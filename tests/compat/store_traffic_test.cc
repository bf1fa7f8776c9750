// What PyTorch 2.15's workers ask the job's store (docs/store_protocol.md, "What PyTorch workers
// ask the store"), checked against the store's own counts by op: 3 gloo workers under a real
// dlaunch agent run init_process_group and a new_group of every rank (store_traffic.py beside
// this file), and the counts of requests from worker sessions must be exactly the model's.
//
// The model is per rank, for a job of W ranks:
//   connecting (TCPStore's constructor): PING, ADD "init/" (VALIDATE is the handshake, not
//     counted as a request);
//   each gloo process group (the default one, then each new_group): SET its own address key,
//     then for each of the W ranks (itself too) WAIT, and a get that the 2.x client sends as
//     WAIT + GET: 1 SET, W GET and 2W WAIT.
// No store-based barrier (TORCH_DIST_INIT_BARRIER is 0 by default in 2.x). The job-wide GET and
// WAIT counts grow as W^2: that is gloo's full mesh, and why the doc models NCCL apart.
//
// Skipped when the 2.15 venv is missing. PyTorch 1.13's counts depend on timing (its
// store-based barrier polls ADD every 10 ms), so it has no exact model and no test here.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN;
const std::string kCompatDir = COMPAT_DIR;
const std::string kTorch2Python = DLAUNCH_TORCH2_PYTHON;

bool torch2_missing() {
  auto probe = run({kTorch2Python, "-c", "import torch.distributed"}, {}, 180s);
  return probe.timed_out || probe.exit.shell_code() != 0;
}

std::map<std::string, int64_t> model_counts(int64_t world, int groups) {
  return {{"PING", world},
          {"ADD", world},
          {"SET", groups * world},
          {"GET", groups * world * world},
          {"WAIT", groups * 2 * world * world}};
}

// `nodes` agents on this machine (c10d, each with a status port) of `per_node` PyTorch 2.15
// workers running `script` (beside this file) with `args`, under --store_proxy `mode`: what the
// script's rank 0 wrote (JSON, given the agents' /status URLs). Null, with the test failed, when
// an agent did not exit 0 or the job was not of nodes x per_node ranks.
nlohmann::json run_proxy_job(const std::string& mode, int nodes, int per_node,
                             const std::string& script, const std::vector<std::string>& args) {
  TempDir dir;
  const std::string output = dir.path() + "/result.json";
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<int> status_ports;
  std::string urls;
  for (int i = 0; i < nodes; ++i) {
    status_ports.push_back(free_port());
    urls += (i ? "," : "") + std::string("http://127.0.0.1:") +
            std::to_string(status_ports.back()) + "/status";
  }
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (int port : status_ports) {
    std::vector<std::string> argv = {
        kDlaunch, "--nnodes=" + std::to_string(nodes),
        "--nproc_per_node=" + std::to_string(per_node), "--rdzv_backend=c10d",
        "--rdzv_endpoint=" + endpoint,
        "--rdzv_id=" + script.substr(0, script.find('.')) + "_" + mode,
        "--status_port=" + std::to_string(port), "--store_proxy=" + mode,
        "--python=" + kTorch2Python, kCompatDir + "/" + script, "--status_url=" + urls,
        "--output=" + output};
    argv.insert(argv.end(), args.begin(), args.end());
    agents.push_back(std::make_unique<Subprocess>(
        argv, std::map<std::string, std::string>{{"OMP_NUM_THREADS", "1"}}));
  }
  std::string context;
  bool all_ok = true;
  for (auto& a : agents) {
    auto e = a->wait(300s);
    context += "--- agent stdout:\n" + a->out() + "--- agent stderr:\n" + a->err();
    if (!e || e->shell_code() != 0) all_ok = false;
  }
  std::ifstream in(output);
  if (!all_ok || !in) {
    ADD_FAILURE() << "an agent did not exit 0, or no " << output << "\n" << context;
    return nullptr;
  }
  nlohmann::json got = nlohmann::json::parse(in);
  if (got["world_size"] != nodes * per_node) {
    ADD_FAILURE() << "world size " << got["world_size"] << "\n" << context;
    return nullptr;
  }
  return got;
}

TEST(StoreTraffic, Torch215WorkersAskExactlyWhatTheModelSays) {
  if (torch2_missing()) GTEST_SKIP() << "no PyTorch 2.15 at " << kTorch2Python
                                     << ": run scripts/setup_torch2.sh (scripts/test.sh does)";
  TempDir dir;
  const int status_port = free_port();
  const std::string output = dir.path() + "/counts.json";
  auto r = run({kDlaunch, "--standalone", "--nproc_per_node=3",
                "--status_port=" + std::to_string(status_port), "--python=" + kTorch2Python,
                kCompatDir + "/store_traffic.py",
                "--status_url=http://127.0.0.1:" + std::to_string(status_port) + "/status",
                "--output=" + output, "--phases=init,new_group"},
               {{"OMP_NUM_THREADS", "1"}}, 300s);
  ASSERT_FALSE(r.timed_out) << r.out;
  ASSERT_EQ(r.exit.shell_code(), 0) << r.out;
  std::ifstream in(output);
  ASSERT_TRUE(in) << "no " << output << "\n" << r.out;
  const auto got = nlohmann::json::parse(in);
  ASSERT_EQ(got["world_size"], 3);
  using Counts = std::map<std::string, int64_t>;
  EXPECT_EQ(got["counts"]["init"].get<Counts>(), model_counts(3, 1)) << got.dump();
  EXPECT_EQ(got["counts"]["new_group"].get<Counts>(), model_counts(3, 2)) << got.dump();
}

// Two nodes (two agents on this machine, c10d) of 3 workers each, with --store_proxy off and on:
// through the proxies the store holds one connection per node instead of one per worker, and
// the workers' requests reach it as the same ops, no more of each (the proxy only forwards or
// groups, and a group counts as one request).
TEST(StoreTraffic, TwoNodesThroughTheStoreProxyAskNoMoreOverFewerConnections) {
  if (torch2_missing()) GTEST_SKIP() << "no PyTorch 2.15 at " << kTorch2Python
                                     << ": run scripts/setup_torch2.sh (scripts/test.sh does)";
  using Counts = std::map<std::string, int64_t>;
  std::map<std::string, nlohmann::json> by_mode;
  for (const std::string mode : {"off", "on"}) {
    SCOPED_TRACE("--store_proxy " + mode);
    by_mode[mode] = run_proxy_job(mode, 2, 3, "store_traffic.py", {"--phases=init,new_group"});
    ASSERT_FALSE(by_mode[mode].is_null());
  }
  const auto& off = by_mode["off"];
  const auto& on = by_mode["on"];
  std::cout << "--store_proxy off: " << off.dump() << "\n--store_proxy on: " << on.dump() << "\n";
  for (const char* phase : {"init", "new_group"}) {
    const auto direct = off["counts"][phase].get<Counts>();
    const auto proxied = on["counts"][phase].get<Counts>();
    EXPECT_EQ(direct, model_counts(6, phase == std::string("init") ? 1 : 2)) << off.dump();
    ASSERT_EQ(proxied.size(), direct.size()) << on.dump();
    for (const auto& [op, n] : direct) {
      ASSERT_TRUE(proxied.count(op)) << op << ": " << on.dump();
      EXPECT_GT(proxied.at(op), 0) << op;
      EXPECT_LE(proxied.at(op), n) << op << ": " << on.dump();
    }
  }
  // Six workers' connections direct, two proxies' through them; the agents' own are the same.
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(on["connections"][i].get<int64_t>(), off["connections"][i].get<int64_t>() - 6 + 2)
        << off.dump() << "\n" << on.dump();
  }
}

// Training through the store proxy: 2 nodes (two agents on this machine, c10d) of 2 workers, a
// small gloo DDP training with fixed seeds (store_proxy_ddp.py beside this file), run with
// --store_proxy off and on. The results must be bit for bit the same (every rank's last loss and
// the parameters' bytes), and the store, read while every worker is connected, must hold one
// connection per worker without the proxy and one per node with it (the agents' own connections
// are the same in both), the workers' connections arriving as channels of the proxies'.
TEST(StoreTraffic, TrainingThroughTheStoreProxyIsIdenticalOverOneConnectionPerNode) {
  if (torch2_missing()) GTEST_SKIP() << "no PyTorch 2.15 at " << kTorch2Python
                                     << ": run scripts/setup_torch2.sh (scripts/test.sh does)";
  constexpr int kNodes = 2;
  constexpr int kWorkersPerNode = 2;
  std::map<std::string, nlohmann::json> by_mode;
  for (const std::string mode : {"off", "on"}) {
    SCOPED_TRACE("--store_proxy " + mode);
    by_mode[mode] =
        run_proxy_job(mode, kNodes, kWorkersPerNode, "store_proxy_ddp.py", {"--steps=5"});
    ASSERT_FALSE(by_mode[mode].is_null());
  }
  const auto& off = by_mode["off"];
  const auto& on = by_mode["on"];
  std::cout << "--store_proxy off: " << off.dump() << "\n--store_proxy on: " << on.dump() << "\n";
  // Compared as JSON numbers: the same doubles, not merely close ones.
  EXPECT_EQ(on["losses"], off["losses"]);
  EXPECT_EQ(on["mean_loss_last"], off["mean_loss_last"]);
  EXPECT_EQ(on["params_sha256"], off["params_sha256"]);
  const int64_t workers = kNodes * kWorkersPerNode;
  const auto& direct = off["store"];
  const auto& proxied = on["store"];
  EXPECT_EQ(direct["channels_opened"].get<int64_t>(), 0) << direct.dump();
  EXPECT_EQ(proxied["channels_opened"].get<int64_t>(), workers) << proxied.dump();
  EXPECT_EQ(direct["connections"].get<int64_t>() - proxied["connections"].get<int64_t>(),
            workers - kNodes)
      << "the store's open connections, off: " << direct.dump() << "\non: " << proxied.dump();
}

}  // namespace
}  // namespace dlaunch::testing
