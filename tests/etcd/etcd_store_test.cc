// EtcdStore against a real etcd 3.4 (label cluster): the Store contract every implementation
// keeps (as tests/rendezvous/store_suite_test.cc checks for the others), plus what only etcd has:
// leases, watches, prefixes per run.
#include "rendezvous/etcd/etcd_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>

#include "common/error.h"
#include "etcd_test_env.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

class EtcdStoreTest : public test::EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (IsSkipped()) return;
    store_ = make_store();
  }

  std::shared_ptr<EtcdStore> store_;
};

TEST_F(EtcdStoreTest, SetThenGetReturnsTheValue) {
  store_->set("a", to_bytes("hello"));
  EXPECT_EQ(to_string(store_->get("a")), "hello");
  store_->set("a", to_bytes(""));
  EXPECT_EQ(to_string(store_->get("a")), "");
  Bytes binary = {0, 1, 2, 255, 0, '\n', '"'};
  store_->set("b", binary);
  EXPECT_EQ(store_->get("b"), binary);
}

TEST_F(EtcdStoreTest, GetOfMissingKeyTimesOutAndStaysUsable) {
  store_->set_timeout(300ms);
  auto start = std::chrono::steady_clock::now();
  try {
    store_->get("never");
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find(prefix_ + "never"), std::string::npos) << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
  store_->set("after", to_bytes("x"));
  EXPECT_EQ(to_string(store_->get("after")), "x");
}

TEST_F(EtcdStoreTest, BlockingGetIsReleasedByALaterSetFromAnotherClient) {
  auto writer = make_store();
  std::thread t([&] {
    std::this_thread::sleep_for(200ms);
    writer->set("late", to_bytes("v"));
  });
  EXPECT_EQ(to_string(store_->get("late")), "v");
  t.join();
}

// The rendezvous' event watcher stops its thread this way (EventWatcher::stop): a get parked on
// the watch ends with StoreInterruptedError at once, not at its timeout, and the store stays
// usable.
TEST_F(EtcdStoreTest, InterruptEndsABlockedGetFromAnotherThread) {
  store_->set_timeout(60s);
  std::atomic<bool> done{false};
  std::string outcome;
  std::thread blocked([&] {
    try {
      store_->get("never");
      outcome = "returned";
    } catch (const StoreInterruptedError&) {
      outcome = "interrupted";
    } catch (const std::exception& e) {
      outcome = std::string("other error: ") + e.what();
    }
    done = true;
  });
  auto start = std::chrono::steady_clock::now();
  // Repeat: an interrupt that lands before the get reaches the watch finds nothing to end.
  while (!done && std::chrono::steady_clock::now() - start < 30s) {
    store_->interrupt();
    std::this_thread::sleep_for(10ms);
  }
  blocked.join();
  EXPECT_EQ(outcome, "interrupted");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);  // the get's timeout is 60 s
  store_->set("after", to_bytes("x"));
  EXPECT_EQ(to_string(store_->get("after")), "x");
}

// A waiting store watches the key it waits for, not its whole prefix: the puts of a round
// (N join keys, N assignments) are no events for it. With one watch over the prefix, the 64
// puts below were 64 events for the waiting store (and every agent's store waits on its
// round's event record).
TEST_F(EtcdStoreTest, AWaitingGetReceivesNoEventsForOtherKeys) {
  store_->set_timeout(60s);
  auto events = [] { return etcd::call_counts()["watch events"]; };
  const int64_t before = events();
  std::thread waiting([&] { EXPECT_EQ(to_string(store_->get("mine")), "v"); });
  std::this_thread::sleep_for(200ms);  // the get is parked on its watch
  auto writer = make_store();
  for (int i = 0; i < 64; ++i) writer->set("other/" + std::to_string(i), to_bytes("x"));
  writer->set("mine", to_bytes("v"));
  waiting.join();
  EXPECT_LE(events() - before, 2) << "watch events for a store waiting on one key";
}

// The event watcher waits on its round's key in 1 s slices: once a read found the key missing,
// the key's watch knows it stays so until a put, and later waits read nothing. A put still ends
// the next wait at once, and after a delete the key is missing again.
TEST_F(EtcdStoreTest, RepeatedWaitsOnAMissingKeyReadItOnce) {
  auto ranges = [] { return etcd::call_counts()["/v3/kv/range"]; };
  const int64_t before = ranges();
  for (int i = 0; i < 10; ++i) {
    EXPECT_THROW(store_->wait({"event"}, 50ms), TimeoutError) << "wait " << i;
  }
  EXPECT_LE(ranges() - before, 1) << "a missing key read again on every wait";
  auto writer = make_store();
  writer->set("event", to_bytes("restart"));
  auto start = std::chrono::steady_clock::now();
  store_->wait({"event"}, 30s);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_EQ(to_string(store_->get("event")), "restart");
  ASSERT_TRUE(writer->delete_key("event"));
  std::this_thread::sleep_for(200ms);  // the delete reaches the watch
  EXPECT_THROW(store_->wait({"event"}, 100ms), TimeoutError) << "a deleted key came back";
  writer->set("event", to_bytes("again"));
  EXPECT_EQ(to_string(store_->get("event")), "again");
}

// Key watches are kept for the next wait on the same key, up to a bound: waiting on more keys
// than that in turn replaces the idle ones, and every wait is still released by its key's put.
TEST_F(EtcdStoreTest, WaitsOnManyKeysInTurnAreEachReleased) {
  store_->set_timeout(60s);
  auto writer = make_store();
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 7; ++i) {
      const std::string key = "k" + std::to_string(i) + "/" + std::to_string(round);
      std::thread setter([&] {
        std::this_thread::sleep_for(50ms);
        writer->set(key, to_bytes(key));
      });
      auto start = std::chrono::steady_clock::now();
      EXPECT_EQ(to_string(store_->get(key)), key);
      EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
      setter.join();
    }
  }
}

TEST_F(EtcdStoreTest, AddCountsFromZeroAndStoresDecimal) {
  EXPECT_EQ(store_->add("c", 5), 5);
  EXPECT_EQ(store_->add("c", -2), 3);
  EXPECT_EQ(store_->add("c", 0), 3);
  EXPECT_EQ(to_string(store_->get("c")), "3");
  store_->set("text", to_bytes("abc"));
  EXPECT_THROW(store_->add("text", 1), ProtocolError);
  store_->set("big", to_bytes(std::to_string(INT64_MAX)));
  EXPECT_THROW(store_->add("big", 1), ProtocolError);
  EXPECT_EQ(to_string(store_->get("big")), std::to_string(INT64_MAX)) << "a refused add writes nothing";
}

TEST_F(EtcdStoreTest, ConcurrentAddsFromManyClientsLoseNoUpdate) {
  constexpr int kClients = 8, kAdds = 25;
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([this] {
      auto s = make_store();
      for (int j = 0; j < kAdds; ++j) s->add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(to_string(store_->get("counter")), std::to_string(kClients * kAdds));
}

TEST_F(EtcdStoreTest, CompareSetFollowsC10dSemantics) {
  auto& s = *store_;
  EXPECT_EQ(to_string(s.compare_set("k", to_bytes("x"), to_bytes("y"))), "x");
  EXPECT_FALSE(s.check({"k"}));
  EXPECT_EQ(to_string(s.compare_set("k", {}, to_bytes("one"))), "one");
  EXPECT_EQ(to_string(s.compare_set("k", to_bytes("one"), to_bytes("two"))), "two");
  EXPECT_EQ(to_string(s.compare_set("k", to_bytes("one"), to_bytes("three"))), "two");
  EXPECT_EQ(to_string(s.get("k")), "two");
}

TEST_F(EtcdStoreTest, CompareSetHasOneWinnerUnderContention) {
  constexpr int kClients = 6;
  std::atomic<int> winners{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([this, i, &winners] {
      auto s = make_store();
      Bytes mine = to_bytes("agent" + std::to_string(i));
      if (s->compare_set("leader", {}, mine) == mine) ++winners;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(winners.load(), 1);
}

TEST_F(EtcdStoreTest, CheckWaitDeleteAndNumKeys) {
  auto& s = *store_;
  EXPECT_EQ(s.num_keys(), 0);
  EXPECT_FALSE(s.check({"x", "y"}));
  s.set("x", to_bytes("1"));
  EXPECT_FALSE(s.check({"x", "y"}));
  s.set("y", to_bytes("2"));
  EXPECT_TRUE(s.check({"x", "y"}));
  s.wait({"x", "y"}, 1s);
  EXPECT_EQ(s.num_keys(), 2);
  EXPECT_TRUE(s.delete_key("x"));
  EXPECT_FALSE(s.delete_key("x"));
  EXPECT_EQ(s.num_keys(), 1);
  EXPECT_THROW(s.wait({"x"}, 200ms), TimeoutError);
}

TEST_F(EtcdStoreTest, WaitIsReleasedWhenTheLastKeyAppears) {
  auto writer = make_store();
  std::thread t([&] {
    writer->set("w1", to_bytes("a"));
    std::this_thread::sleep_for(150ms);
    writer->set("w2", to_bytes("b"));
  });
  store_->wait({"w1", "w2"}, 10s);
  EXPECT_TRUE(store_->check({"w1", "w2"}));
  t.join();
}

TEST_F(EtcdStoreTest, MultiSetAndMultiGetAcrossTxnLimit) {
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (int i = 0; i < 150; ++i) {  // more than one txn's worth
    keys.push_back("m" + std::to_string(i));
    values.push_back(to_bytes(std::to_string(i * i)));
  }
  store_->multi_set(keys, values);
  EXPECT_EQ(store_->multi_get(keys), values);
  EXPECT_TRUE(store_->check(keys));
  EXPECT_EQ(store_->num_keys(), 150);
  EXPECT_THROW(store_->multi_set({"a"}, {}), UsageError);
}

TEST_F(EtcdStoreTest, PrefixesIsolateRuns) {
  EtcdStore other(make_client(), prefix_ + "other-run/");
  other.set("k", to_bytes("theirs"));
  store_->set("k2", to_bytes("ours"));
  EXPECT_FALSE(store_->check({"k"}));
  EXPECT_FALSE(other.check({"k2"}));
  EXPECT_EQ(other.num_keys(), 1);
}

TEST_F(EtcdStoreTest, LeasedKeyVanishesWhenTheLeaseExpires) {
  auto& client = store_->client();
  auto lease = client.lease_grant(1);
  EXPECT_GE(lease.ttl, 1);
  store_->set_with_lease("alive", to_bytes("1"), lease.id);
  EXPECT_TRUE(store_->check({"alive"}));
  // Kept alive, it survives longer than its TTL.
  for (int i = 0; i < 4; ++i) {
    std::this_thread::sleep_for(400ms);
    EXPECT_TRUE(client.lease_keepalive(lease.id).has_value());
  }
  EXPECT_TRUE(store_->check({"alive"}));
  // Left alone, etcd expires it (TTL 1 s; etcd may take up to ~1 s more), deleting the key,
  // and a late keepalive answers 200 without a TTL.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (store_->check({"alive"}) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_FALSE(store_->check({"alive"}));
  EXPECT_EQ(client.lease_keepalive(lease.id), std::nullopt);
  EXPECT_THROW(store_->set_with_lease("late", to_bytes("1"), lease.id), etcd::GatewayStatusError);
  client.lease_revoke(lease.id);  // revoking an expired lease is fine
}

TEST_F(EtcdStoreTest, RevokeDeletesLeasedKeysAtOnce) {
  auto& client = store_->client();
  auto lease = client.lease_grant(60);
  store_->set_with_lease("a", to_bytes("1"), lease.id);
  store_->set_with_lease("b", to_bytes("1"), lease.id);
  client.lease_revoke(lease.id);
  EXPECT_FALSE(store_->check({"a"}));
  EXPECT_FALSE(store_->check({"b"}));
}

TEST_F(EtcdStoreTest, WatchSeesPutsAndDeletesAndCanBeCancelled) {
  auto client = make_client();
  auto rev = client->range(prefix_).revision;
  auto watch = client->watch(prefix_, etcd::prefix_end(prefix_), rev + 1);
  store_->set("w", to_bytes("1"));
  store_->delete_key("w");
  std::vector<etcd::Event::Type> seen;
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (seen.size() < 2) {
    auto m = watch->next(deadline);
    ASSERT_TRUE(m.has_value()) << "no watch event within 10 s";
    for (auto& e : m->events) seen.push_back(e.type);
  }
  EXPECT_EQ(seen,
            (std::vector<etcd::Event::Type>{etcd::Event::Type::kPut, etcd::Event::Type::kDelete}));
  // A deadline with nothing happening returns empty and leaves the watch usable.
  EXPECT_FALSE(watch->next(std::chrono::steady_clock::now() + 100ms).has_value());
  store_->set("w", to_bytes("2"));
  auto m = watch->next(std::chrono::steady_clock::now() + 10s);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->events.at(0).kv.value, "2");
  // cancel() from another thread releases a blocked next().
  std::thread canceller([&] {
    std::this_thread::sleep_for(200ms);
    watch->cancel();
  });
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(watch->next(std::chrono::steady_clock::now() + 30s), ClosedError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  canceller.join();
}

TEST_F(EtcdStoreTest, UnreachableEndpointIsAConnectionErrorNamingItAndWhatToDo) {
  etcd::ClientOptions o;
  o.endpoint = "127.0.0.1:1";  // nothing listens on port 1
  o.connect_timeout = 2s;
  EtcdStore s(std::make_shared<etcd::Client>(o), prefix_);
  try {
    s.set("k", to_bytes("v"));
    FAIL() << "expected ConnectionError";
  } catch (const ConnectionError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot connect to etcd at 127.0.0.1:1: "), std::string::npos) << what;
    // What to do, for a user: not a pointer at this repository's test scripts.
    EXPECT_NE(what.find("start etcd, or check --rdzv_endpoint"), std::string::npos) << what;
    EXPECT_EQ(what.find("tests/"), std::string::npos) << what;
  }
}

// A private etcd that this test stops while a get() blocks on it: the get must fail, not hang.
TEST(EtcdStoreServerDeath, BlockedGetFailsWhenEtcdDies) {
  if (test::find_test_etcd().endpoint.empty()) GTEST_SKIP() << test::find_test_etcd().skip_reason;
  char dir_template[] = "/tmp/dlaunch-etcd-death-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string scripts = DLAUNCH_CLUSTER_SCRIPTS;
  ASSERT_EQ(std::system((scripts + "/start_etcd.sh " + dir + " >/dev/null 2>&1").c_str()), 0);
  std::string endpoint;
  std::ifstream(dir + "/endpoint") >> endpoint;
  etcd::ClientOptions o;
  o.endpoint = endpoint;
  EtcdStore s(std::make_shared<etcd::Client>(o), "/death/");
  s.set_timeout(60s);
  std::thread killer([&] {
    std::this_thread::sleep_for(500ms);
    std::system((scripts + "/stop_etcd.sh " + dir + " >/dev/null 2>&1").c_str());
  });
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(s.get("never"), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  killer.join();
  EXPECT_THROW(s.set("k", to_bytes("v")), ConnectionError);
}

}  // namespace
}  // namespace dlaunch
