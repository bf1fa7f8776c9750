// The exit barrier over an in-memory store: the last node in releases every waiter; a node
// alone times out; leaving never throws.
#include "launcher/agent/exit_barrier.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "common/error.h"
#include "rendezvous/store/in_memory_store.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

TEST(ExitBarrier, TheLastNodeInReleasesEveryone) {
  InMemoryStore store;
  std::vector<std::thread> nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.emplace_back([&store]() { wait_exit_barrier(store, 4, 3, 10s); });
  }
  for (auto& t : nodes) t.join();
  EXPECT_TRUE(store.check({"dlaunch/exit_barrier/4/done"}));
}

TEST(ExitBarrier, ANodeAloneTimesOut) {
  InMemoryStore store;
  EXPECT_THROW(wait_exit_barrier(store, 0, 2, 50ms), TimeoutError);
}

TEST(ExitBarrier, LeavingCountsInAndTheHostWaitsForAll) {
  InMemoryStore store;
  leave_exit_barrier(store, 1, 2, /*hosts_store=*/false, 10s);  // returns at once
  EXPECT_FALSE(store.check({"dlaunch/exit_barrier/1/left/done"}));
  leave_exit_barrier(store, 1, 2, /*hosts_store=*/true, 10s);
  EXPECT_TRUE(store.check({"dlaunch/exit_barrier/1/left/done"}));
  // A host whose peers never leave waits out the timeout and only logs.
  leave_exit_barrier(store, 2, 2, /*hosts_store=*/true, 50ms);
}

}  // namespace
}  // namespace dlaunch
