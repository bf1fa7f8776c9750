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
#include <nlohmann/json.hpp>
#include <string>

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

}  // namespace
}  // namespace dlaunch::testing
