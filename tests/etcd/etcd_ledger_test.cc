// EtcdRoundLedger against a real etcd 3.4 (label cluster): the join path of the etcd
// rendezvous. Each "node" here is its own client, store and ledger, as separate agents have.
#include "rendezvous/etcd/etcd_ledger.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <thread>

#include "common/error.h"
#include "etcd_test_env.h"
#include "rendezvous/etcd/etcd_rendezvous.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

class EtcdLedgerTest : public test::EtcdTest {
 protected:
  std::unique_ptr<EtcdRoundLedger> make_ledger(std::shared_ptr<EtcdStore> store = nullptr) {
    return std::make_unique<EtcdRoundLedger>(store ? store : make_store(), kRdzv, 1s,
                                             steady_clock());
  }
  static NodeDescriptor node(const std::string& id, int64_t hint = -1) {
    return {id, "host-" + id, 2, hint};
  }
  static double since(TimePoint t) { return to_seconds(steady_clock().now() - t); }

  static constexpr const char* kRdzv = "dlaunch/rdzv/job";
  // {MIN, MAX, last call}
  const DynamicLimits two{2, 2, 60s}, three{3, 3, 1s}, five{5, 5, 1s}, one_to_three{1, 3, 1s};
};

TEST_F(EtcdLedgerTest, ConcurrentJoinsGetDenseIndicesInArrivalOrderWithOneKeyEach) {
  constexpr int kNodes = 24;
  std::vector<int64_t> index(kNodes, 0);
  std::vector<std::string> failure(kNodes);
  std::vector<std::thread> threads;
  std::atomic<bool> go{false};
  for (int i = 0; i < kNodes; ++i) {
    threads.emplace_back([&, i] {
      try {
        auto ledger = make_ledger();
        while (!go) std::this_thread::yield();
        index[i] = ledger->join(0, node("n" + std::to_string(i)));
      } catch (const std::exception& e) {
        failure[i] = e.what();
      }
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  for (int i = 0; i < kNodes; ++i) ASSERT_EQ(failure[i], "") << "node " << i;
  std::vector<int64_t> sorted = index;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < kNodes; ++i) EXPECT_EQ(sorted[i], i + 1) << "indices must be 1..N";

  // Arrival i is the node that got index i; every descriptor comes back whole.
  auto reader = make_ledger();
  auto nodes = reader->participants(0, kNodes);
  ASSERT_EQ(nodes.size(), static_cast<size_t>(kNodes));
  for (int i = 0; i < kNodes; ++i) {
    const auto& d = nodes[index[i] - 1];
    EXPECT_EQ(d.id, "n" + std::to_string(i));
    EXPECT_EQ(d.host, "host-n" + std::to_string(i));
    EXPECT_EQ(d.local_world_size, 2);
  }
  EXPECT_EQ(reader->participants(0, 5).size(), 5u);
  EXPECT_EQ(reader->arrivals(0, steady_clock().now()).arrivals, kNodes);
  // One put per node and nothing else: no shared counter that nodes compare-and-swap.
  EXPECT_EQ(make_store()->num_keys(), kNodes);
}

TEST_F(EtcdLedgerTest, JoiningAgainKeepsTheFirstIndex) {
  auto a = make_ledger(), b = make_ledger();
  EXPECT_EQ(a->join(3, node("a")), 1);
  EXPECT_EQ(b->join(3, node("b")), 2);
  // A retried join (its first answer lost) finds its key and the index it had.
  EXPECT_EQ(a->join(3, node("a")), 1);
  EXPECT_EQ(a->arrivals(3, steady_clock().now()).arrivals, 2);
  // Rounds are separate.
  EXPECT_EQ(b->join(4, node("b")), 1);
  EXPECT_EQ(a->arrivals(4, steady_clock().now()).arrivals, 1);
}

TEST_F(EtcdLedgerTest, ParticipantsRefusesARoundWithFewerJoins) {
  auto a = make_ledger();
  a->join(0, node("a"));
  EXPECT_THROW(a->participants(0, 2), StateError);
  EXPECT_TRUE(a->participants(0, 0).empty());
}

TEST_F(EtcdLedgerTest, WaitWakesWhenTheLastNodeArrives) {
  auto a = make_ledger();
  a->join(0, node("a"));
  std::thread late([&] {
    std::this_thread::sleep_for(200ms);
    make_ledger()->join(0, node("b"));
  });
  auto start = steady_clock().now();
  a->wait(0, std::string(kRdzv) + "/round/0/done", &two, start + 60s);
  late.join();
  EXPECT_LT(since(start), 30.0) << "wait must end when MAX arrived, not at `until`";
  EXPECT_EQ(a->arrivals(0, steady_clock().now()).arrivals, 2);
}

TEST_F(EtcdLedgerTest, WaitEndsAfterLastCallCountedFromTheLatestArrival) {
  auto a = make_ledger();
  a->join(0, node("a"));
  std::atomic<double> b_joined{0};
  auto start = steady_clock().now();
  std::thread late([&] {
    std::this_thread::sleep_for(300ms);
    make_ledger()->join(0, node("b"));
    b_joined = since(start);
  });
  // MIN 1 is met at once; a new arrival within last call (1 s) restarts it.
  a->wait(0, std::string(kRdzv) + "/round/0/done", &one_to_three, start + 60s);
  const double waited = since(start);
  late.join();
  EXPECT_GE(waited, b_joined + 0.9) << "last call must restart at the second arrival";
  EXPECT_LT(waited, 30.0);
  auto c = a->arrivals(0, steady_clock().now());
  EXPECT_EQ(c.arrivals, 2);
}

TEST_F(EtcdLedgerTest, WaitEndsOnTheWakeKeyOrAtUntilWithoutThrowing) {
  auto store = make_store();
  auto a = make_ledger(store);
  a->join(0, node("a"));
  const std::string done = a->round_key(0, "done");
  auto start = steady_clock().now();
  a->wait(0, done, &five, start + 300ms);  // nothing happens: returns at until
  EXPECT_GE(since(start), 0.29);
  std::thread setter([&] {
    std::this_thread::sleep_for(200ms);
    make_store()->set(done, to_bytes("1"));
  });
  start = steady_clock().now();
  a->wait(0, done, &five, start + 60s);
  setter.join();
  EXPECT_LT(since(start), 30.0) << "wait must end when the wake key is set";
}

// A node that arrived after its round completed waits for the next one: arrivals, which exceed
// MAX by then, must not wake it (it would spin re-reading the state).
TEST_F(EtcdLedgerTest, WaitWithoutLimitsIgnoresArrivals) {
  auto a = make_ledger();
  a->join(0, node("a"));
  make_ledger()->join(0, node("b"));
  auto late = make_ledger();
  late->join(0, node("late"));  // 3 arrivals, MAX 2
  auto start = steady_clock().now();
  late->wait(0, late->round_key(0, "superseded"), nullptr, start + 500ms);
  EXPECT_GE(since(start), 0.49);
  std::thread opener([&] {
    std::this_thread::sleep_for(100ms);
    make_store()->set(late->round_key(0, "superseded"), to_bytes("1"));
  });
  start = steady_clock().now();
  late->wait(0, late->round_key(0, "superseded"), nullptr, start + 60s);
  opener.join();
  EXPECT_LT(since(start), 30.0);
}

TEST_F(EtcdLedgerTest, WaitKeyReturnsTheValueOrTimesOut) {
  auto a = make_ledger();
  a->join(2, node("a"));
  const std::string key = a->round_key(2, "workers_store");
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    make_store()->set(key, to_bytes("10.0.0.1:4242"));
  });
  EXPECT_EQ(to_string(a->wait_key(2, key, steady_clock().now() + 60s)), "10.0.0.1:4242");
  setter.join();
  // A key set before this ledger looked is found too (the ledger reads the round afresh).
  EXPECT_EQ(to_string(make_ledger()->wait_key(2, key, steady_clock().now() + 60s)),
            "10.0.0.1:4242");
  auto start = steady_clock().now();
  EXPECT_THROW(a->wait_key(2, a->round_key(2, "never"), start + 300ms), TimeoutError);
  EXPECT_GE(since(start), 0.29);
}

TEST_F(EtcdLedgerTest, WatchFromACompactedRevisionIsReplacedByAFreshRead) {
  auto store = make_store();
  auto a = make_ledger(store);
  a->join(0, node("a"));
  make_ledger()->join(0, node("b"));
  // Compact everything up to now: a's watch (opened at its first wait, from its join's
  // revision) is refused by etcd; the ledger must read the round again instead of failing.
  store->set("unrelated", to_bytes("1"));  // so that b's join revision is compacted too
  int64_t revision = store->client().range("/").revision;
  store->client().call("/v3/kv/compaction",
                       R"({"revision":")" + std::to_string(revision) + R"(","physical":true})");
  make_ledger()->join(0, node("c"));
  auto start = steady_clock().now();
  a->wait(0, a->round_key(0, "done"), &three, start + 60s);
  EXPECT_LT(since(start), 30.0);
  EXPECT_EQ(a->arrivals(0, steady_clock().now()).arrivals, 3);
}

// The arrival count is read, not watched, by a node that is not the round's first arrival
// (forming_round_slice.h: once per keep-alive interval, 1 s here): MAX reached ends its wait
// within about that, and so does the last call when the first arrival is gone.
TEST_F(EtcdLedgerTest, ANodeThatIsNotTheFirstArrivalSeesTheCountWithinASlice) {
  auto first = make_ledger(), b = make_ledger();
  first->join(0, node("first"));  // then never waits: as if it died
  b->join(0, node("b"));
  std::thread late([&] {
    std::this_thread::sleep_for(200ms);
    make_ledger()->join(0, node("c"));
  });
  auto start = steady_clock().now();
  b->wait(0, b->round_key(0, "done"), &three, start + 60s);
  late.join();
  EXPECT_LT(since(start), 10.0) << "MAX reached must end the wait within a slice or so";
  EXPECT_EQ(b->arrivals(0, steady_clock().now()).arrivals, 3);

  // Round 1: MIN 1 is met; the last call (1 s) is measured by b from when it saw a change.
  first->join(1, node("first"));
  b->join(1, node("b"));
  start = steady_clock().now();
  b->wait(1, b->round_key(1, "done"), &one_to_three, start + 60s);
  EXPECT_GE(since(start), 0.9) << "the last call restarts at b's own arrival";
  EXPECT_LT(since(start), 10.0) << "a first arrival that never looks must not stall the round";
}

// Only the MAX-th arrival (right after its join) and the first arrival (backing it up) close a
// full round at once; another node that saw it full gives them a slice (1 s here) before it
// decides, so hundreds of nodes do not race to close it.
TEST_F(EtcdLedgerTest, ANodeThatSawTheRoundFullGivesItsClosersASliceFirst) {
  auto first = make_ledger(), b = make_ledger();
  first->join(0, node("first"));
  b->join(0, node("b"));
  make_ledger()->join(0, node("c"));  // the third of MAX 3: it would close the round
  auto start = steady_clock().now();
  first->wait(0, first->round_key(0, "done"), &three, start + 60s);
  EXPECT_LT(since(start), 0.9) << "the first arrival backs the closer up at once";
  // b reads the count after its 1 s slice, sees the round full, and gives the closers a second:
  // the round's "done", set at 1.5 s, ends its wait (at 1 s it would have gone to close it).
  std::thread closer([&] {
    std::this_thread::sleep_for(1500ms);
    make_store()->set(b->round_key(0, "done"), to_bytes("1"));
  });
  start = steady_clock().now();
  b->wait(0, b->round_key(0, "done"), &three, start + 60s);
  const double waited = since(start);
  closer.join();
  EXPECT_GE(waited, 1.3) << "b left to close the round as soon as it saw it full";
  EXPECT_LT(waited, 10.0);
  // Nobody closes round 1: b decides after the slice.
  first->join(1, node("first"));
  b->join(1, node("b"));
  make_ledger()->join(1, node("c"));
  start = steady_clock().now();
  b->wait(1, b->round_key(1, "done"), &three, start + 60s);
  EXPECT_LT(since(start), 10.0) << "a closer that never came must not stall b";
}

// A waiting node's watch covers the round's control keys only: arrivals are no watch events for
// it (before the join keys moved out of round/<r>/, each of the N waiting nodes got an event
// per later arrival: 16 x 15 / 2 = 120 here), nor are adds to the round's counters (32 adds
// below: 16 x 32 = 512 events with a watch over the whole prefix).
TEST_F(EtcdLedgerTest, ArrivalsAreNoWatchEventsForTheWaitingNodes) {
  constexpr int kNodes = 16;
  const DynamicLimits never{kNodes + 1, kNodes + 1, 60s};  // only "done" ends the waits
  auto events = [] { return etcd::call_counts()["watch events"]; };
  const int64_t before = events();
  std::vector<std::unique_ptr<EtcdRoundLedger>> ledgers;
  std::vector<std::thread> waiting;
  std::vector<double> waited(kNodes, -1);
  for (int i = 0; i < kNodes; ++i) {
    ledgers.push_back(make_ledger());
    ledgers.back()->join(0, node("n" + std::to_string(i)));
    waiting.emplace_back([&, i] {
      auto start = steady_clock().now();
      ledgers[i]->wait(0, ledgers[i]->round_key(0, "done"), &never, start + 60s);
      waited[i] = since(start);
    });
    std::this_thread::sleep_for(50ms);  // its watch is open before the next node joins
  }
  // Nor are the counters every node of a round may add to (racing closers, failure acks).
  auto other = make_store();
  for (int i = 0; i < kNodes; ++i) {
    other->add(ledgers[0]->round_key(0, "closer"), 1);
    other->add(ledgers[0]->round_key(0, "acks"), 1);
  }
  other->set(ledgers[0]->round_key(0, "done"), to_bytes("1"));
  for (auto& t : waiting) t.join();
  for (int i = 0; i < kNodes; ++i) EXPECT_LT(waited[i], 30.0) << "node " << i << " woke on done";
  EXPECT_LE(events() - before, 2 * kNodes) << "watch events for " << kNodes << " waiting nodes";
}

// An agent of a build before the joins/ prefix joins under round/<r>/join/: the new nodes never
// count it, so they refuse the mix in one sentence instead of forming rounds without it.
TEST_F(EtcdLedgerTest, AJoinKeyInTheOldLayoutIsRefusedNamingTheNode) {
  auto a = make_ledger();
  a->join(0, node("a"));
  std::thread old([&] {
    std::this_thread::sleep_for(100ms);
    make_store()->set(a->round_key(0, "join/old"), NodeDescriptor{"old", "host-old", 2, -1}.encode());
  });
  try {
    a->wait(0, a->round_key(0, "done"), &five, steady_clock().now() + 30s);
    ADD_FAILURE() << "the wait ended without noticing the old build's join";
  } catch (const StateError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'old' on host-old"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("same dlaunch build"), std::string::npos) << e.what();
  }
  old.join();
}

// Lease liveness (make_lease_liveness): a neighbour seen alive is not read again while etcd says
// its lease lives (one timetolive call now and then, not a transaction every keep-alive step),
// and its death is still seen when its lease runs out.
class EtcdLivenessTest : public test::EtcdTest {
 protected:
  static double since(TimePoint t) { return to_seconds(steady_clock().now() - t); }
};

TEST_F(EtcdLivenessTest, ALiveNeighbourCostsATimeToLiveNowAndThenAndItsDeathIsSeenInTime) {
  const Duration window = 3s;  // a 3 s lease
  const std::string prefix = "dlaunch/rdzv/liveness";
  auto b = make_lease_liveness(make_store(), prefix, "b", window, steady_clock());
  auto a = make_lease_liveness(make_store(), prefix, "a", window, steady_clock());
  b->beat();  // its lease and alive key
  auto count = [](const char* what) { return etcd::call_counts()[what]; };
  const int64_t txns = count("/v3/kv/txn"), ttls = count("/v3/lease/timetolive");
  // 2 s of checks every 50 ms (40, as 4 keep-alive steps a 0.2 s interval would make), b beating
  // every 0.5 s.
  auto start = steady_clock().now();
  TimePoint last_beat = start;
  for (int i = 0; to_seconds(steady_clock().now() - start) < 2.0; ++i) {
    if (i % 10 == 9) {
      b->beat();
      last_beat = steady_clock().now();
    }
    EXPECT_TRUE(a->dead({"b"}).empty()) << "check " << i;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_LE(count("/v3/kv/txn") - txns, 2) << "the keys of a live neighbour were read again";
  EXPECT_LE(count("/v3/lease/timetolive") - ttls, 6);
  // b stops beating: its lease runs out 3 s after its last beat, and a sees it then.
  double seen_after = -1;
  while (since(last_beat) < 15.0) {
    if (!a->dead({"b"}).empty()) {
      seen_after = since(last_beat);
      break;
    }
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_GE(seen_after, 2.5) << "declared dead while its lease lived";
  EXPECT_LE(seen_after, 3.0 + 1.5) << "seen later than the lease's end + etcd's expiry check";
}

int64_t gateway_calls() {
  int64_t n = 0;
  for (const auto& [what, count] : etcd::call_counts()) {
    if (what.rfind("/v3/", 0) == 0) n += count;
  }
  return n;
}

// The whole etcd rendezvous in this process: a node arriving after a full round completed
// waits for the next round on its watch, checking the running round's liveness once per
// keep-alive interval, instead of re-reading etcd in a loop; set_closed() releases it.
TEST_F(EtcdLedgerTest, LateNodeWaitsForTheNextRoundWithoutPolling) {
  RendezvousParams p;
  p.backend = "etcd";
  p.endpoint = endpoint_;
  p.run_id = "late-" + std::to_string(std::random_device{}());
  p.min_nodes = p.max_nodes = 1;
  p.host = "127.0.0.1";
  p.config = RendezvousConfig::split(
      "last_call_timeout=0.1,keep_alive_interval=0.5,keep_alive_max_attempt=4,join_timeout=60");
  auto a = make_etcd_rendezvous(p);
  EXPECT_EQ(a->next_rendezvous().group_world_size, 1);
  auto b = make_etcd_rendezvous(p);
  std::atomic<bool> closed{false};
  std::string error;
  std::thread late([&] {
    try {
      b->next_rendezvous();
      error = "the late node completed a round of a full, running group";
    } catch (const StateError& e) {
      closed = true;  // "rendezvous ... is closed"
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  auto deadline = steady_clock().now() + 30s;
  while (a->num_nodes_waiting() < 1 && steady_clock().now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(a->num_nodes_waiting(), 1) << error;
  // Two seconds: both keep-alive threads beat 4 times each (2 calls a beat at most) and the
  // late node checks the running round 4 times (a few calls each). A loop re-reading the
  // state would make hundreds.
  const int64_t before = gateway_calls();
  std::this_thread::sleep_for(2s);
  const int64_t calls = gateway_calls() - before;
  EXPECT_LT(calls, 80) << "gateway calls in 2 s while one node waits for the next round";
  a->set_closed();
  late.join();
  EXPECT_TRUE(closed) << error;
  b->shutdown();
  a->shutdown();
}

}  // namespace
}  // namespace dlaunch
