// Store liveness with a scripted clock: a node is dead only after its counter stood still for
// the whole window on the observer's clock, and never after it left cleanly.
#include "rendezvous/handlers/liveness.h"

#include <gtest/gtest.h>

#include "rendezvous/store/in_memory_store.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

TEST(StoreLiveness, DeadOnlyAfterASilentWindowAndNeverAfterLeaving) {
  auto store = std::make_shared<InMemoryStore>();
  FakeClock clock;
  auto a = make_store_liveness(store, "p", "a", 3s, clock);
  auto b = make_store_liveness(store, "p", "b", 3s, clock);
  auto c = make_store_liveness(store, "p", "c", 3s, clock);
  auto observer = make_store_liveness(store, "p", "o", 3s, clock);
  std::vector<std::string> all = {"a", "b", "c", "o"};
  a->beat();
  b->beat();
  c->beat();
  EXPECT_TRUE(observer->dead(all).empty());  // first sight starts every window
  for (int i = 0; i < 4; ++i) {
    clock.advance(1s);
    a->beat();  // a keeps beating; b and c go silent; c leaves cleanly
    if (i == 0) c->leave();
    auto dead = observer->dead(all);
    if (i < 2) {
      EXPECT_TRUE(dead.empty()) << i;
    } else {
      EXPECT_EQ(dead, (std::vector<std::string>{"b"})) << i;
    }
  }
  b->beat();  // b comes back: its window starts over
  EXPECT_TRUE(observer->dead(all).empty());
  // A node that never beat at all is dead one window after it was first asked about.
  EXPECT_TRUE(observer->dead({"ghost"}).empty());
  clock.advance(3s);
  EXPECT_EQ(observer->dead({"ghost"}), (std::vector<std::string>{"ghost"}));
}

// gone() is what a node waiting for a running round to end asks: a node that left cleanly is
// gone at once (nobody will act for it), a silent one after the window, a beating one never.
TEST(StoreLiveness, GoneCountsLeftNodesAtOnceAndSilentOnesAfterTheWindow) {
  auto store = std::make_shared<InMemoryStore>();
  FakeClock clock;
  auto a = make_store_liveness(store, "p", "a", 3s, clock);
  auto b = make_store_liveness(store, "p", "b", 3s, clock);
  auto c = make_store_liveness(store, "p", "c", 3s, clock);
  auto observer = make_store_liveness(store, "p", "o", 3s, clock);
  std::vector<std::string> all = {"a", "b", "c"};
  a->beat();
  b->beat();
  c->beat();
  c->leave();
  EXPECT_EQ(observer->gone(all), (std::vector<std::string>{"c"}));
  EXPECT_TRUE(observer->dead(all).empty());  // dead() still never names a node that left
  clock.advance(3s);
  a->beat();
  EXPECT_EQ(observer->gone(all), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(observer->dead(all), (std::vector<std::string>{"b"}));
}

}  // namespace
}  // namespace dlaunch
