// A formed round's release alone, over the in-memory store and its ledger: the closer writes
// the table and every node's place, "done" last; too few described nodes reopen the next round;
// a closer that died is replaced by the first waiting node within the keep-alive window.
#include "rendezvous/handlers/round_release.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "rendezvous/handlers/store_ledger.h"
#include "rendezvous/store/in_memory_store.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

const std::string kPrefix = "dlaunch/rdzv/job1";

class RoundReleaseTest : public ::testing::Test {
 protected:
  // `min_nodes`: --nnodes MIN; `window`: the keep-alive window, on the real clock.
  std::unique_ptr<RoundRelease> make(int64_t min_nodes, Duration window = 200ms) {
    return std::make_unique<RoundRelease>(
        RoundRelease::Settings{"job1", kPrefix, min_nodes, window}, store_, ledger_,
        steady_clock());
  }
  // Arrivals 1..n of `round`, each described (the ledger holds them).
  void join(int64_t round, int n) {
    for (int i = 0; i < n; ++i) {
      ledger_->join(round, NodeDescriptor{"n" + std::to_string(i), "h" + std::to_string(i), 2});
    }
  }
  DynamicState complete(int64_t round, int64_t n) {
    DynamicState s{round, DynamicState::Status::kComplete, n};
    store_->set(kPrefix + "/state", s.encode());
    return s;
  }
  TimePoint soon() const { return steady_clock().now() + 20s; }

  std::shared_ptr<InMemoryStore> store_ = std::make_shared<InMemoryStore>();
  std::shared_ptr<RoundLedger> ledger_ =
      std::make_shared<StoreRoundLedger>(store_, kPrefix, 100ms, steady_clock());
};

TEST_F(RoundReleaseTest, TheCloserWritesEveryPlaceAndEachNodeReadsItsOwn) {
  join(0, 3);
  auto state = complete(0, 3);
  auto closer = make(2);
  closer->release(state, soon());
  for (int64_t arrival = 1; arrival <= 3; ++arrival) {
    auto released = make(2)->wait(state, arrival, soon());
    ASSERT_TRUE(released[0]);
    EXPECT_TRUE(RoundRelease::released_with_table(*released[0]));
    auto place = make(2)->read_place(state, arrival, released, soon());
    EXPECT_EQ(place.table.participants, 3);
    EXPECT_EQ(place.me.rank, arrival - 1);  // no hints: ranks in arrival order
    EXPECT_EQ(place.restart_count, 0);
  }
}

TEST_F(RoundReleaseTest, FewerDescribedNodesThanMinReopenTheNextRound) {
  join(1, 1);  // arrival 2 counted itself in and died before describing itself
  store_->add(kPrefix + "/round/1/arrivals", 1);
  auto state = complete(1, 2);
  make(2, 100ms)->release(state, soon());
  auto released = make(2)->wait(state, 1, soon());
  ASSERT_TRUE(released[0]);
  EXPECT_TRUE(RoundRelease::reopened(*released[0]));
  auto next = DynamicState::decode(store_->get(kPrefix + "/state"));
  ASSERT_TRUE(next);
  EXPECT_EQ(next->round, 2);
  EXPECT_EQ(next->status, DynamicState::Status::kOpen);
  EXPECT_TRUE(store_->check({kPrefix + "/round/1/superseded"}));
}

TEST_F(RoundReleaseTest, AWaitingNodeReleasesTheRoundOfACloserThatDied) {
  join(0, 2);
  auto state = complete(0, 2);  // and its closer died before releasing it
  auto released = make(2, 100ms)->wait(state, 2, soon());
  ASSERT_TRUE(released[0]);
  EXPECT_TRUE(RoundRelease::released_with_table(*released[0]));
  EXPECT_EQ(store_->add(kPrefix + "/round/0/takeover", 0), 1);
  EXPECT_EQ(make(2)->read_place(state, 2, released, soon()).me.rank, 1);
}

}  // namespace
}  // namespace dlaunch
