// A Kubernetes pod deletion seen by dlaunch: SIGTERM to one node's agent, then SIGKILL after the
// pod's grace period. In an elastic job that is a node leaving, not a failure: the others
// re-form without spending the restart budget, the terminated agent exits 143 without a report
// blaming its workers (they died of the SIGTERM it forwarded), and a new pod joins back.
// Real agents on 127.0.0.1 (c10d); tests/rendezvous/netns_test.cc plays the same with a
// replacement of the same hostname at a new address, tests/etcd/etcd_dlaunch_test.cc over etcd.
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN;
const std::string kWorker = TEST_WORKER_BIN;

// --nnodes 2:4 (Kubeflow's elastic PET_NNODES), --max_restarts 0: a restart that spends the
// budget ends the job with exit 1, so finishing proves none was spent. Last call 3 s: round 0
// has all three nodes even when one agent starts late on a busy machine. Two workers per node:
// on SIGTERM local rank 0 dies at once and local rank 1 takes 3 s (it writes a checkpoint), so
// the other nodes' workers fail while the terminated agent still runs. The job finishes once it
// has its 6 workers again.
std::vector<std::string> agent_argv(const std::string& endpoint, const std::string& ready,
                                    const std::string& worker_mode,
                                    const std::string& slow_stop = "3",
                                    const std::string& shutdown_grace = "5") {
  return {kDlaunch,
          "--shutdown_grace",
          shutdown_grace,
          "--nnodes",
          "2:4",
          "--nproc_per_node",
          "2",
          "--rdzv_backend",
          "c10d",
          "--rdzv_endpoint",
          endpoint,
          "--rdzv_id",
          "poddeletion",
          "--max_restarts",
          "0",
          "--rdzv_conf",
          "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3",
          kWorker,
          worker_mode,
          "ready=" + ready,
          "slow_stop=" + slow_stop,
          "finish_world=6"};
}

size_t first_node_not_hosting_the_store(const std::vector<std::unique_ptr<Subprocess>>& nodes) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i]->err().find("hosting the job's store") == std::string::npos) return i;
  }
  return nodes.size();
}

// Three agents whose workers fail as soon as a peer's is gone (gloo's way). One agent (not the
// store's host: that one is the job's single point of failure) gets SIGTERM: its workers die of
// it at once, which makes the others' fail a moment later, while the terminated agent is still
// alive. Then a replacement agent joins and the job finishes on three nodes again.
TEST(DlaunchPodDeletion, SigtermedNodeLeavesWithoutSpendingTheBudgetAndANewPodJoins) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  TempDir ready;
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(std::make_unique<Subprocess>(
        agent_argv(endpoint, ready.path(), "fail-when-peer-dies")));
  }
  ASSERT_TRUE(wait_ready(ready, 6, 60s));
  const size_t victim = first_node_not_hosting_the_store(nodes);
  ASSERT_LT(victim, nodes.size());
  Subprocess& terminated = *nodes[victim];
  terminated.signal(SIGTERM);
  // Kubernetes' default grace is 30 s; dlaunch's own (--shutdown_grace) is 5 s.
  auto end = terminated.wait(30s);
  if (!end) {
    terminated.signal(SIGKILL);
    end = terminated.wait(10s);
  }
  ASSERT_TRUE(end);
  EXPECT_EQ(end->shell_code(), 128 + SIGTERM) << terminated.err();
  // Its workers were stopped, they did not fail: no report, nothing blamed on them.
  EXPECT_EQ(terminated.err().find("job FAILED"), std::string::npos) << terminated.err();
  EXPECT_EQ(terminated.err().find("Root cause"), std::string::npos) << terminated.err();
  EXPECT_EQ(terminated.err().find(") failed:"), std::string::npos) << terminated.err();

  // The two others re-form free and run on, two nodes, restart count 0.
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == victim) continue;
    ASSERT_TRUE(wait_until(
        [&] { return nodes[i]->out().find("waiting rank=") != std::string::npos; }, 60s))
        << nodes[i]->out() << nodes[i]->err();
    EXPECT_NE(nodes[i]->out().find("world=4 attempt=1 restart_count=0"), std::string::npos)
        << nodes[i]->out() << nodes[i]->err();
    EXPECT_NE(nodes[i]->err().find(") left"), std::string::npos) << nodes[i]->err();
    EXPECT_NE(nodes[i]->err().find("not counted as a restart"), std::string::npos)
        << nodes[i]->err();
  }

  // The new pod: its workers (their first attempt) just succeed; the others' third attempt
  // finishes on the three nodes.
  Subprocess replacement(agent_argv(endpoint, ready.path(), "ok"));
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == victim) continue;
    auto e = nodes[i]->wait(90s);
    ASSERT_TRUE(e) << nodes[i]->err();
    EXPECT_EQ(e->shell_code(), 0) << nodes[i]->err();
    EXPECT_NE(nodes[i]->out().find("world=6 attempt=2 restart_count=0"), std::string::npos)
        << nodes[i]->out() << nodes[i]->err();
  }
  auto e = replacement.wait(60s);
  ASSERT_TRUE(e) << replacement.err();
  EXPECT_EQ(e->shell_code(), 0) << replacement.err();
}

// The pod's grace period runs out first: its local rank 1 would take a minute to stop, dlaunch
// would wait its --shutdown_grace of 30 s, and the kubelet SIGKILLs the agent after 3 s. The
// others were told at the SIGTERM and have re-formed free; the SIGKILL changes nothing for them.
TEST(DlaunchPodDeletion, NodeSigkilledAfterThePodsGraceStillCostsNoRestart) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  TempDir ready;
  std::vector<std::unique_ptr<Subprocess>> nodes;
  nodes.push_back(
      std::make_unique<Subprocess>(agent_argv(endpoint, ready.path(), "fail-when-peer-dies")));
  ASSERT_TRUE(wait_until(
      [&] { return nodes[0]->err().find("hosting the job's store") != std::string::npos; }, 30s))
      << nodes[0]->err();
  nodes.push_back(
      std::make_unique<Subprocess>(agent_argv(endpoint, ready.path(), "fail-when-peer-dies")));
  nodes.push_back(std::make_unique<Subprocess>(
      agent_argv(endpoint, ready.path(), "fail-when-peer-dies", "60", "30")));
  ASSERT_TRUE(wait_ready(ready, 6, 60s));
  Subprocess& deleted = *nodes[2];
  deleted.signal(SIGTERM);
  EXPECT_FALSE(deleted.wait(3s)) << "the test needs an agent that outlives the pod's grace";
  deleted.signal(SIGKILL);
  ASSERT_TRUE(deleted.wait(10s));
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(wait_until(
        [&] { return nodes[i]->out().find("waiting rank=") != std::string::npos; }, 60s))
        << nodes[i]->out() << nodes[i]->err();
    EXPECT_NE(nodes[i]->out().find("world=4 attempt=1 restart_count=0"), std::string::npos)
        << nodes[i]->out() << nodes[i]->err();
    EXPECT_NE(nodes[i]->err().find("not counted as a restart"), std::string::npos)
        << nodes[i]->err();
  }
  // Then the whole job is deleted: every node leaves, and each exits 143.
  for (size_t i = 0; i < 2; ++i) nodes[i]->signal(SIGTERM);
  for (size_t i = 0; i < 2; ++i) {
    auto e = nodes[i]->wait(30s);
    ASSERT_TRUE(e) << nodes[i]->err();
    EXPECT_EQ(e->shell_code(), 128 + SIGTERM) << nodes[i]->err();
  }
}

}  // namespace
}  // namespace dlaunch::testing
