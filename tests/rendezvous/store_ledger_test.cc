// StoreRoundLedger over the in-memory store: the c10d rendezvous' arrivals, descriptors and
// waits, as DynamicRendezvous drives them (key layout: round/<r>/arrivals, round/<r>/node/<i>).
#include "rendezvous/handlers/store_ledger.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/error.h"
#include "rendezvous/store/in_memory_store.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

constexpr const char* kPrefix = "dlaunch/rdzv/job";

class StoreLedgerTest : public ::testing::Test {
 protected:
  std::unique_ptr<StoreRoundLedger> make_ledger() {
    return std::make_unique<StoreRoundLedger>(store_, kPrefix, 1s, steady_clock());
  }
  static NodeDescriptor node(const std::string& id) { return {id, "host-" + id, 2, -1}; }

  std::shared_ptr<InMemoryStore> store_ = std::make_shared<InMemoryStore>();
};

TEST_F(StoreLedgerTest, JoinsGetDenseIndicesAndTheStoreLayoutOfTheC10dBackend) {
  auto a = make_ledger(), b = make_ledger(), c = make_ledger();
  EXPECT_EQ(a->join(3, node("a")), 1);
  EXPECT_EQ(b->join(3, node("b")), 2);
  EXPECT_EQ(c->join(3, node("c")), 3);
  // The wire layout other builds read: the counter and one descriptor per index.
  EXPECT_EQ(store_->add("dlaunch/rdzv/job/round/3/arrivals", 0), 3);
  EXPECT_EQ(NodeDescriptor::decode(store_->get("dlaunch/rdzv/job/round/3/node/2")).id, "b");
  EXPECT_EQ(a->arrivals(3, steady_clock().now()).arrivals, 3);
  EXPECT_EQ(a->arrivals(4, steady_clock().now()).arrivals, 0);
  auto d = a->described(3, 3, steady_clock().now());
  ASSERT_EQ(d.nodes.size(), 3u);
  EXPECT_EQ(d.nodes[0].id, "a");
  EXPECT_EQ(d.nodes[2].id, "c");
  EXPECT_EQ(d.indexes, (std::vector<int64_t>{1, 2, 3}));
}

TEST_F(StoreLedgerTest, AnArrivalThatNeverDescribedItselfIsLeftOutAfterTheWait) {
  auto a = make_ledger();
  EXPECT_EQ(a->join(0, node("a")), 1);
  store_->add("dlaunch/rdzv/job/round/0/arrivals", 1);  // counted in, died before describing
  EXPECT_EQ(a->join(0, node("c")), 3);
  auto start = steady_clock().now();
  auto d = a->described(0, 3, start + 200ms);
  EXPECT_GE(steady_clock().now() - start, 200ms);  // it waited for the missing one
  ASSERT_EQ(d.nodes.size(), 2u);
  EXPECT_EQ(d.indexes, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(d.nodes[1].id, "c");
}

TEST_F(StoreLedgerTest, TheLastCallIsMeasuredFromWhenThisNodeSawTheCountChange) {
  auto a = make_ledger(), b = make_ledger();
  a->join(0, node("a"));
  auto first = a->arrivals(0, steady_clock().now());
  EXPECT_EQ(first.arrivals, 1);
  b->join(0, node("b"));
  auto later = steady_clock().now() + 1s;
  auto second = a->arrivals(0, later);
  EXPECT_EQ(second.arrivals, 2);
  EXPECT_EQ(second.changed_at, later);
  EXPECT_EQ(a->arrivals(0, later + 1s).changed_at, later);  // no news: unchanged
}

TEST_F(StoreLedgerTest, WaitEndsWhenTheWakeKeyIsSetAndWaitKeyReturnsItsValue) {
  auto a = make_ledger();
  a->join(0, node("a"));
  const std::string done = ledger_round_key(kPrefix, 0, "done");
  const DynamicLimits limits{2, 4, 60s};
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    store_->set(done, to_bytes("2"));
  });
  auto start = steady_clock().now();
  // The first arrival polls every last_call/5 capped at 250 ms; the key ends the wait sooner
  // or at the next slice at the latest.
  while (!store_->check({done})) a->wait(0, done, &limits, start + 30s);
  setter.join();
  EXPECT_LT(steady_clock().now() - start, 10s);
  EXPECT_EQ(to_string(a->wait_key(0, done, steady_clock().now() + 30s)), "2");
  EXPECT_THROW(a->wait_key(0, ledger_round_key(kPrefix, 0, "never"), steady_clock().now() + 100ms),
               TimeoutError);
}

// A node waiting in its round reads with the wait's end what it decides by: the keys it asks
// for and the round's count, whether the wake key came (ready) or the slice ended.
TEST_F(StoreLedgerTest, WaitFetchingBringsTheKeysAndTheCountWhetherWokenOrNot) {
  auto a = make_ledger(), b = make_ledger();
  a->join(0, node("a"));
  b->join(0, node("b"));
  const std::string done = ledger_round_key(kPrefix, 0, "done");
  store_->set("dlaunch/rdzv/job/state", to_bytes("S"));
  auto start = steady_clock().now();
  // Not the first arrival: one slice (the keep-alive interval, 1 s, bounded by `until`).
  auto f = b->wait_fetching(0, {done, "dlaunch/rdzv/job/state"}, nullptr, start + 200ms);
  EXPECT_GE(steady_clock().now() - start, 190ms);
  ASSERT_TRUE(f.has_value());
  EXPECT_FALSE(f->got.ready);
  ASSERT_EQ(f->got.values.size(), 2u);
  EXPECT_FALSE(f->got.values[0].has_value());
  EXPECT_EQ(f->got.values[1], to_bytes("S"));
  EXPECT_EQ(f->arrivals.arrivals, 2);
  store_->add("dlaunch/rdzv/job/round/0/arrivals", 1);
  store_->set(done, to_bytes("2"));
  f = b->wait_fetching(0, {done}, nullptr, steady_clock().now() + 30s);
  ASSERT_TRUE(f.has_value());
  EXPECT_TRUE(f->got.ready);
  EXPECT_EQ(f->got.values[0], to_bytes("2"));
  EXPECT_EQ(f->arrivals.arrivals, 3);
  // A slice already over reads nothing.
  EXPECT_FALSE(b->wait_fetching(0, {done}, nullptr, steady_clock().now() - 1s).has_value());
  // wait_key_fetching: the key's value and the others', or TimeoutError at the deadline.
  auto v = b->wait_key_fetching(0, {done, "dlaunch/rdzv/job/state", "none"},
                                steady_clock().now() + 30s);
  EXPECT_EQ(v[0], to_bytes("2"));
  EXPECT_EQ(v[1], to_bytes("S"));
  EXPECT_FALSE(v[2].has_value());
  EXPECT_THROW(b->wait_key_fetching(0, {ledger_round_key(kPrefix, 0, "never")},
                                    steady_clock().now() + 100ms),
               TimeoutError);
}

TEST_F(StoreLedgerTest, WaitReturnsAtUntilWhenNothingHappens) {
  auto a = make_ledger();
  a->join(0, node("a"));
  auto start = steady_clock().now();
  a->wait(0, ledger_round_key(kPrefix, 0, "superseded"), nullptr, start + 150ms);
  auto took = steady_clock().now() - start;
  EXPECT_GE(took, 140ms);
  EXPECT_LT(took, 5s);
}

}  // namespace
}  // namespace dlaunch
