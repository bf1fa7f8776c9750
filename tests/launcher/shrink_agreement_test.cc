// The store side of an in-process shrink: the nodes' agreement (shrink_agreement.h) and what the
// agent writes for the workers (rank_replacement.h), against an in-memory store; threads play
// the nodes of one round.
#include "launcher/agent/shrink_agreement.h"

#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <vector>

#include "launcher/agent/rank_replacement.h"
#include "rendezvous/store/in_memory_store.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

// `kept` nodes counted themselves in before joining round 5 (after round 4); `members` of them
// are in it, and `fresh` nodes in it did not keep workers (they take no part).
std::vector<bool> agree(int kept, int members, int fresh, Duration timeout = 5s) {
  InMemoryStore store;
  for (int i = 0; i < kept; ++i) mark_kept_workers(store, 4);
  std::vector<std::future<bool>> nodes;
  for (int i = 0; i < members; ++i) {
    nodes.push_back(std::async(std::launch::async, [&store, members, fresh, timeout]() {
      return agree_to_shrink(store, 4, 5, members + fresh, timeout);
    }));
  }
  std::vector<bool> out;
  for (auto& n : nodes) out.push_back(n.get());
  return out;
}

TEST(ShrinkAgreement, EveryNodeKeptItsWorkersAndNoneIsMissing) {
  EXPECT_EQ(agree(2, 2, 0), (std::vector<bool>{true, true}));
  EXPECT_EQ(agree(1, 1, 0), (std::vector<bool>{true}));
}

TEST(ShrinkAgreement, ASurvivorMissingFromTheRoundRestartsIt) {
  EXPECT_EQ(agree(3, 2, 0), (std::vector<bool>{false, false}));
}

TEST(ShrinkAgreement, ANewNodeInTheRoundRestartsItAfterTheWait) {
  EXPECT_EQ(agree(2, 2, 1, 200ms), (std::vector<bool>{false, false}));
}

TEST(ShrinkAgreement, TheFirstAnswerHolds) {
  InMemoryStore store;
  mark_kept_workers(store, 0);
  store.set("shrink/round_1/verdict", to_bytes("restart"));
  EXPECT_FALSE(agree_to_shrink(store, 0, 1, 1));
}

TEST(RankRecoveryShrink, TheCounterGoesOnFromWhatTheWorkersSaw) {
  auto store = std::make_shared<InMemoryStore>();
  RankRecovery recovery;
  recovery.begin("K", "unused", 0, std::nullopt);
  recovery.use_store_for_tests(store);
  EXPECT_EQ(recovery.current_generation(), 0);
  recovery.announce(kReplaceVerdict);
  recovery.announce(kReplaceVerdict);
  EXPECT_EQ(recovery.current_generation(), 2);
  // The new round's start emptied the workers' namespace: the counter is gone.
  store->delete_key("K");
  EXPECT_EQ(recovery.announce_shrink(2, 4, 7), 3);
  EXPECT_EQ(to_string(store->get("K/3")), "shrink 4 7");
  // Where it survived, it is not set back.
  EXPECT_EQ(recovery.announce_shrink(2, 2, 8), 4);
  recovery.tell_new_ranks(7, {{4, 2}, {5, 3}});
  EXPECT_EQ(to_string(store->get("K/shrink_7/rank_4")), "2");
  EXPECT_EQ(to_string(store->get("K/shrink_7/rank_5")), "3");
}

}  // namespace
}  // namespace dlaunch
