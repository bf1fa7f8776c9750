// Issue 13: the nodes of a job compare their hang verdicts through the job's store, so a node
// whose ranks only wait in a collective names the rank stuck on another node.
#include "launcher/hang/hang_exchange.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "rendezvous/store/in_memory_store.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

NodeHangVerdict verdict(int64_t node, bool stuck, int64_t rank) {
  NodeHangVerdict v;
  v.node_rank = node;
  v.host = "node-" + std::to_string(node);
  v.stuck_here = stuck;
  v.rank = rank;
  v.local_rank = 0;
  v.pid = 1000 + static_cast<int>(rank);
  v.where = stuck ? "load_batch (train.py:22)" : "all_reduce (distributed_c10d.py:1536)";
  v.python_stack = "  File \"train.py\", line 22 in load_batch\n";
  v.stacks_dir = "/run/attempt_0/0";
  return v;
}

TEST(HangExchange, VerdictSurvivesTheStoreAndGarbageIsNotOne) {
  NodeHangVerdict v = verdict(3, true, 7);
  auto back = decode_hang_verdict(encode_hang_verdict(v));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->node_rank, 3);
  EXPECT_EQ(back->host, "node-3");
  EXPECT_TRUE(back->stuck_here);
  EXPECT_EQ(back->rank, 7);
  EXPECT_EQ(back->pid, 1007);
  EXPECT_EQ(back->where, v.where);
  EXPECT_EQ(back->python_stack, v.python_stack);
  EXPECT_EQ(back->stacks_dir, v.stacks_dir);
  EXPECT_FALSE(back->replaceable);
  v.replaceable = true;  // its node replaces the stuck rank alone
  EXPECT_TRUE(decode_hang_verdict(encode_hang_verdict(v))->replaceable);
  EXPECT_FALSE(decode_hang_verdict("not json"));
  EXPECT_FALSE(decode_hang_verdict(R"({"host": "x"})"));
}

TEST(HangExchange, OnlyANodeOfVictimsLooksElsewhereAndTakesTheLowestStuckNode) {
  EXPECT_FALSE(pick_remote_hang_root(verdict(0, true, 0), {verdict(1, true, 1)}))
      << "a node with its own stuck rank keeps it";
  EXPECT_FALSE(pick_remote_hang_root(verdict(0, false, 0), {verdict(1, false, 1)}))
      << "nobody stuck elsewhere: the local verdict stands";
  auto root =
      pick_remote_hang_root(verdict(0, false, 0), {verdict(2, true, 2), verdict(1, true, 1)});
  ASSERT_TRUE(root);
  EXPECT_EQ(root->node_rank, 1);
}

TEST(HangExchange, NodeNamesAStuckRankThatAnotherNodePublishesWithinTheWait) {
  InMemoryStore store;
  HangExchangeRequest victims{5, 2, verdict(0, false, 0), 5s};
  std::thread other([&]() {
    std::this_thread::sleep_for(200ms);
    exchange_hang_verdicts(store, HangExchangeRequest{5, 2, verdict(1, true, 1), 5s});
  });
  auto start = std::chrono::steady_clock::now();
  auto root = exchange_hang_verdicts(store, victims);
  auto took = std::chrono::steady_clock::now() - start;
  other.join();
  ASSERT_TRUE(root);
  EXPECT_EQ(root->rank, 1);
  EXPECT_EQ(root->host, "node-1");
  EXPECT_LT(took, 4s) << "ends when the stuck rank is heard of, not at the deadline";
  EXPECT_TRUE(store.check({hang_verdict_key(5, 0)})) << "its own verdict is published too";
}

TEST(HangExchange, WaitIsBoundedWhenNoOtherNodeAnswersOrAllWait) {
  InMemoryStore store;
  store.set(hang_verdict_key(9, 1), to_bytes(encode_hang_verdict(verdict(1, false, 1))));
  auto start = std::chrono::steady_clock::now();
  auto root = exchange_hang_verdicts(store, HangExchangeRequest{9, 3, verdict(0, false, 0), 300ms});
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(root);
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 5s);
  // A verdict of an earlier round is not this round's.
  store.set(hang_verdict_key(8, 2), to_bytes(encode_hang_verdict(verdict(2, true, 2))));
  EXPECT_FALSE(exchange_hang_verdicts(store, HangExchangeRequest{9, 3, verdict(0, false, 0), 100ms}));
}

}  // namespace
}  // namespace dlaunch
