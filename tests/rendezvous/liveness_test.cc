// Store liveness with a scripted clock: a node is dead only after its counter stood still for
// the whole window on the observer's clock, and never after it left cleanly.
#include "rendezvous/handlers/liveness.h"

#include <gtest/gtest.h>

#include <functional>
#include <utility>

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

// A store whose add() answers late (this node's link was cut: the request waited out TCP's
// retransmissions); `meanwhile` runs before the answer, as the rest of the job goes on.
class LateStore final : public Store {
 public:
  explicit LateStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}
  std::function<void()> meanwhile;  // run once, by the next add()
  void set(const std::string& k, const Bytes& v) override { inner_->set(k, v); }
  Bytes get(const std::string& k) override { return inner_->get(k); }
  int64_t add(const std::string& k, int64_t d) override {
    if (auto late = std::exchange(meanwhile, nullptr)) late();
    return inner_->add(k, d);
  }
  Bytes compare_set(const std::string& k, const Bytes& e, const Bytes& d) override {
    return inner_->compare_set(k, e, d);
  }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  void wait(const std::vector<std::string>& keys, Duration t) override { inner_->wait(keys, t); }
  bool delete_key(const std::string& k) override { return inner_->delete_key(k); }
  int64_t num_keys() override { return inner_->num_keys(); }

 private:
  std::shared_ptr<Store> inner_;
};

// The observer's own link is cut for 12 s while its neighbours beat on: its read, asked before
// the cut, is answered after it. That time is the observer's silence, not the neighbours': a
// neighbour whose beats went on is not dead a moment later; one that stopped before the cut is
// dead at the next read (its silence is proven up to that read's asking).
TEST(StoreLiveness, TimeTheObserverCouldNotReachTheStoreIsNotItsNeighboursSilence) {
  auto inner = std::make_shared<InMemoryStore>();
  auto late = std::make_shared<LateStore>(inner);
  FakeClock clock;
  auto a = make_store_liveness(inner, "p", "a", 3s, clock);
  auto b = make_store_liveness(inner, "p", "b", 3s, clock);
  auto observer = make_store_liveness(late, "p", "o", 3s, clock);
  a->beat();
  b->beat();
  EXPECT_TRUE(observer->dead({"a", "b"}).empty());  // first sight
  clock.advance(1s);
  a->beat();
  EXPECT_TRUE(observer->dead({"a", "b"}).empty());  // b's window runs from t=0
  late->meanwhile = [&] {
    for (int i = 0; i < 12; ++i) {  // a beats once a second through the cut; b is silent
      clock.advance(1s);
      a->beat();
    }
    clock.advance(600ms);  // the retransmission after the link came back
  };
  EXPECT_TRUE(observer->dead({"a"}).empty());  // a moved: its window starts at this answer
  clock.advance(500ms);  // a's next beat is not due yet
  EXPECT_TRUE(observer->dead({"a"}).empty()) << "a beat through the observer's cut";
  EXPECT_EQ(observer->dead({"b"}), (std::vector<std::string>{"b"}));
}

// A node that joined the round that now runs was alive then, though its counter stood still
// (its keep-alive still waited for the store after a cut link): its window starts again.
TEST(StoreLiveness, RestartedWindowsForgetTheSilenceBeforeTheRound) {
  auto store = std::make_shared<InMemoryStore>();
  FakeClock clock;
  auto a = make_store_liveness(store, "p", "a", 3s, clock);
  auto observer = make_store_liveness(store, "p", "o", 3s, clock);
  a->beat();
  EXPECT_TRUE(observer->dead({"a"}).empty());
  clock.advance(5s);
  EXPECT_EQ(observer->dead({"a"}), (std::vector<std::string>{"a"}));
  observer->restart_windows();  // a joined the new round
  EXPECT_TRUE(observer->dead({"a"}).empty());
  clock.advance(2s);
  EXPECT_TRUE(observer->dead({"a"}).empty());
  clock.advance(1s);
  EXPECT_EQ(observer->dead({"a"}), (std::vector<std::string>{"a"}));  // silent in it too
}

}  // namespace
}  // namespace dlaunch
