// One suite, every Store implementation: in-memory, prefix over in-memory, TCP client against
// an in-process TcpStoreServer (with and without the job token; as a worker's and as an agent's
// client, and an agent's against a server older than FEATURES; and through a node's store
// proxy, with and without the token).
#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <thread>

#include "common/error.h"
#include "store_test_support.h"

namespace dlaunch::test {
namespace {

using namespace std::chrono_literals;

template <typename B>
class StoreSuite : public ::testing::Test {
 protected:
  B backend;
  std::shared_ptr<Store> store = backend.client();
};

using Backends =
    ::testing::Types<InMemoryBackend, PrefixBackend, TcpBackend, TcpTokenBackend, TcpAgentBackend,
                     TcpAgentTokenBackend, TcpAgentOlderServerBackend, ProxyBackend,
                     ProxyTokenBackend>;
TYPED_TEST_SUITE(StoreSuite, Backends);

TYPED_TEST(StoreSuite, SetThenGetReturnsTheValue) {
  this->store->set("a", to_bytes("hello"));
  EXPECT_EQ(to_string(this->store->get("a")), "hello");
  this->store->set("a", to_bytes(""));
  EXPECT_EQ(to_string(this->store->get("a")), "");
  Bytes binary = {0, 1, 2, 255, 0};
  this->store->set("b", binary);
  EXPECT_EQ(this->store->get("b"), binary);
}

TYPED_TEST(StoreSuite, GetOfMissingKeyTimesOut) {
  this->store->set_timeout(200ms);
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(this->store->get("never"), TimeoutError);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 150ms);
  // The store stays usable after a timeout.
  this->store->set("after", to_bytes("x"));
  EXPECT_EQ(to_string(this->store->get("after")), "x");
}

TYPED_TEST(StoreSuite, BlockingGetIsReleasedByALaterSetFromAnotherThread) {
  auto writer = this->backend.client();
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    writer->set("late", to_bytes("v"));
  });
  EXPECT_EQ(to_string(this->store->get("late")), "v");
  t.join();
}

TYPED_TEST(StoreSuite, AddCountsFromZeroAndStoresDecimal) {
  EXPECT_EQ(this->store->add("c", 5), 5);
  EXPECT_EQ(this->store->add("c", -2), 3);
  EXPECT_EQ(this->store->add("c", 0), 3);
  EXPECT_EQ(to_string(this->store->get("c")), "3");
}

// A sum past int64 is refused (it was signed overflow, undefined behaviour a client could
// trigger in the server), and the counter keeps its value.
TYPED_TEST(StoreSuite, AddThatWouldOverflowIsRefused) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(this->store->add("big", max), max);
  EXPECT_THROW(this->store->add("big", 1), Error);
  EXPECT_EQ(to_string(this->backend.client()->get("big")), std::to_string(max));
  EXPECT_EQ(this->backend.client()->add("small", std::numeric_limits<int64_t>::min()),
            std::numeric_limits<int64_t>::min());
  EXPECT_THROW(this->backend.client()->add("small", -1), Error);
}

TYPED_TEST(StoreSuite, CompareSetFollowsC10dSemantics) {
  auto& s = *this->store;
  // Missing key, non-empty expected: nothing stored, `expected` returned.
  EXPECT_EQ(to_string(s.compare_set("k", to_bytes("x"), to_bytes("y"))), "x");
  EXPECT_FALSE(s.check({"k"}));
  // Missing key, empty expected: desired stored.
  EXPECT_EQ(to_string(s.compare_set("k", {}, to_bytes("one"))), "one");
  // Match: swapped.
  EXPECT_EQ(to_string(s.compare_set("k", to_bytes("one"), to_bytes("two"))), "two");
  // Mismatch: current value returned, unchanged.
  EXPECT_EQ(to_string(s.compare_set("k", to_bytes("one"), to_bytes("three"))), "two");
  EXPECT_EQ(to_string(s.get("k")), "two");
}

TYPED_TEST(StoreSuite, CheckWaitDeleteAndNumKeys) {
  auto& s = *this->store;
  int64_t before = s.num_keys();
  EXPECT_FALSE(s.check({"x", "y"}));
  s.set("x", to_bytes("1"));
  EXPECT_FALSE(s.check({"x", "y"}));
  s.set("y", to_bytes("2"));
  EXPECT_TRUE(s.check({"x", "y"}));
  s.wait({"x", "y"}, 1s);
  EXPECT_EQ(s.num_keys(), before + 2);
  EXPECT_TRUE(s.delete_key("x"));
  EXPECT_FALSE(s.delete_key("x"));
  EXPECT_FALSE(s.check({"x"}));
  EXPECT_EQ(s.num_keys(), before + 1);
  EXPECT_THROW(s.wait({"x"}, 150ms), TimeoutError);
}

TYPED_TEST(StoreSuite, WaitIsReleasedWhenTheLastKeyAppears) {
  auto writer = this->backend.client();
  std::thread t([&] {
    writer->set("w1", to_bytes("1"));
    std::this_thread::sleep_for(50ms);
    writer->add("w2", 1);
  });
  this->store->wait({"w1", "w2"}, 10s);
  EXPECT_TRUE(this->store->check({"w1", "w2"}));
  t.join();
}

// "Wait forever" is Duration::max(): it must wait, not overflow into a past deadline.
TYPED_TEST(StoreSuite, WaitWithTheLargestTimeoutWaitsForTheKey) {
  auto writer = this->backend.client();
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    writer->set("forever", to_bytes("v"));
  });
  EXPECT_NO_THROW(this->store->wait({"forever"}, Duration::max()));
  t.join();
  this->store->set_timeout(Duration::max());
  EXPECT_EQ(to_string(this->store->get("forever")), "v");
}

TYPED_TEST(StoreSuite, MultiSetAndMultiGet) {
  auto& s = *this->store;
  s.multi_set({"m1", "m2", "m3"}, {to_bytes("a"), to_bytes(""), to_bytes("c")});
  auto values = s.multi_get({"m3", "m1", "m2"});
  ASSERT_EQ(values.size(), 3u);
  EXPECT_EQ(to_string(values[0]), "c");
  EXPECT_EQ(to_string(values[1]), "a");
  EXPECT_EQ(to_string(values[2]), "");
  EXPECT_THROW(s.multi_set({"a"}, {}), UsageError);
  s.set_timeout(150ms);
  EXPECT_THROW(s.multi_get({"m1", "absent"}), TimeoutError);
}

TYPED_TEST(StoreSuite, WaitGetReadsEveryKeyOnceTheFirstExists) {
  this->store->set("a", to_bytes("1"));
  this->store->set("c", to_bytes("333"));
  auto got = this->store->wait_get({"a", "b", "c"}, 5s);
  EXPECT_TRUE(got.ready);
  ASSERT_EQ(got.values.size(), 3u);
  EXPECT_EQ(got.values[0], to_bytes("1"));
  EXPECT_FALSE(got.values[1].has_value());  // missing, and not waited for
  EXPECT_EQ(got.values[2], to_bytes("333"));
  EXPECT_THROW(this->store->wait_get({}, 1s), UsageError);
}

TYPED_TEST(StoreSuite, WaitGetIsReleasedByALaterSetFromAnotherThread) {
  auto writer = this->backend.client();
  this->store->set("other", to_bytes("x"));
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    writer->set("late", to_bytes("here"));
  });
  auto got = this->store->wait_get({"late", "other"}, 30s);
  t.join();
  EXPECT_TRUE(got.ready);
  EXPECT_EQ(got.values[0], to_bytes("here"));
  EXPECT_EQ(got.values[1], to_bytes("x"));
}

TYPED_TEST(StoreSuite, WaitGetThatTimesOutReturnsTheValuesAsTheyAre) {
  this->store->set("x", to_bytes("v"));
  auto began = std::chrono::steady_clock::now();
  auto got = this->store->wait_get({"never", "x"}, 200ms);
  EXPECT_GE(std::chrono::steady_clock::now() - began, 190ms);
  EXPECT_FALSE(got.ready);
  EXPECT_FALSE(got.values[0].has_value());
  EXPECT_EQ(got.values[1], to_bytes("v"));
  // The store goes on serving this client.
  this->store->set("y", to_bytes("w"));
  EXPECT_EQ(this->store->get("y"), to_bytes("w"));
}

TYPED_TEST(StoreSuite, ManyConcurrentClientsAddWithoutLosingUpdates) {
  constexpr int kThreads = 64, kOps = 50;
  std::vector<std::shared_ptr<Store>> clients;
  for (int i = 0; i < kThreads; ++i) clients.push_back(this->backend.client());
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      try {
        for (int j = 0; j < kOps; ++j) {
          clients[i]->add("counter", 1);
          clients[i]->set("t" + std::to_string(i), to_bytes(std::to_string(j)));
        }
      } catch (...) {
        ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(this->store->add("counter", 0), kThreads * kOps);
  EXPECT_EQ(to_string(this->store->get("t63")), std::to_string(kOps - 1));
}

TYPED_TEST(StoreSuite, ServerStoppedMidRequestFailsInsteadOfHanging) {
  if (!TypeParam::kIsTcp) GTEST_SKIP() << "only a networked store has a server to stop";
  auto blocked = this->backend.client();
  std::atomic<int> outcome{0};  // 1 closed/connection error, 2 other
  std::thread t([&] {
    try {
      blocked->get("never-set");
    } catch (const ClosedError&) {
      outcome = 1;
    } catch (const ConnectionError&) {
      outcome = 1;
    } catch (...) {
      outcome = 2;
    }
  });
  std::this_thread::sleep_for(100ms);
  auto start = std::chrono::steady_clock::now();
  this->backend.stop_server();
  t.join();
  EXPECT_EQ(outcome.load(), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

}  // namespace
}  // namespace dlaunch::test
