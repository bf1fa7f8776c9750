// The keep-alive alone, stepped by the test (drive_externally) with a scripted clock over an
// in-memory store: it declares the store lost after the window of silence (at once when the
// port refuses), waits out an outage of a store outside every agent, reports a silent
// neighbour with the round's verdict and an event, and tells the others when this node leaves.
#include "rendezvous/handlers/keep_alive.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "rendezvous/handlers/rendezvous_events.h"
#include "rendezvous/store/in_memory_store.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

const std::string kPrefix = "dlaunch/rdzv/job1";

// An in-memory store that fails every call the way a TCP store does once `failure` is set.
class FlakyStore final : public Store {
 public:
  enum class Failure { kNone, kSilent, kRefused };
  Failure failure = Failure::kNone;

  void set(const std::string& k, const Bytes& v) override { ok(), inner_.set(k, v); }
  Bytes get(const std::string& k) override { return ok(), inner_.get(k); }
  int64_t add(const std::string& k, int64_t d) override { return ok(), inner_.add(k, d); }
  Bytes compare_set(const std::string& k, const Bytes& e, const Bytes& d) override {
    return ok(), inner_.compare_set(k, e, d);
  }
  bool check(const std::vector<std::string>& ks) override { return ok(), inner_.check(ks); }
  void wait(const std::vector<std::string>& ks, Duration t) override { ok(), inner_.wait(ks, t); }
  using Store::wait;
  bool delete_key(const std::string& k) override { return ok(), inner_.delete_key(k); }
  int64_t num_keys() override { return ok(), inner_.num_keys(); }

 private:
  void ok() const {
    if (failure == Failure::kSilent) throw TimeoutError("store 10.0.0.1:29400: no answer");
    if (failure == Failure::kRefused) {
      throw StoreRefusedError("store 10.0.0.1:29400: connection refused");
    }
  }
  InMemoryStore inner_;
};

// One node: its keep-alive, verdicts and store loss over the job's store, on the test's clock
// (interval 1 s, window 3 s).
struct Node {
  Node(std::shared_ptr<Store> store, const std::string& id, const Clock& clock,
       bool store_dies_with_host = true)
      : loss(store),
        verdicts(FailureVerdicts::Settings{"job1", kPrefix, id, 1s, 3}, store, loss, clock),
        keep_alive(
            KeepAlive::Settings{"job1", kPrefix, id, "h" + id, "10.0.0.1:29400", 1s, 3,
                                store_dies_with_host},
            [store] { return store; },
            [id, &clock](std::shared_ptr<Store> s) {
              return make_store_liveness(std::move(s), kPrefix, id, 3s, clock);
            },
            verdicts, loss, clock) {
    keep_alive.drive_externally();
    loss.tell([this](const RendezvousEvent& e) { told.push_back(e); });
  }
  StoreLoss loss;
  FailureVerdicts verdicts;
  KeepAlive keep_alive;
  std::vector<RendezvousEvent> told;
};

std::string value(Store& store, const std::string& key) {
  return store.check({key}) ? to_string(store.get(key)) : std::string("(none)");
}

TEST(KeepAlive, DeclaresTheStoreLostAfterTheWindowWithoutAnAnswer) {
  auto store = std::make_shared<FlakyStore>();
  FakeClock clock;
  Node a(store, "a", clock);
  EXPECT_TRUE(a.keep_alive.step());  // the store answers
  store->failure = FlakyStore::Failure::kSilent;
  for (Duration d : {1000ms, 1500ms}) {  // 1 s, 2.5 s of silence: retried
    clock.advance(d);
    EXPECT_TRUE(a.keep_alive.step());
    EXPECT_EQ(a.loss.reason(), "");
  }
  clock.advance(1s);  // 3.5 s: past the window
  EXPECT_TRUE(a.keep_alive.step());
  const std::string reason = a.loss.reason();
  EXPECT_NE(reason.find("the agent hosting the c10d store at 10.0.0.1:29400 (--rdzv_endpoint) "
                        "has not answered for 3.5 s"),
            std::string::npos)
      << reason;
  ASSERT_EQ(a.told.size(), 1u);
  EXPECT_EQ(a.told[0].kind, RendezvousEvent::Kind::kStoreLost);
  EXPECT_EQ(a.told[0].reason, reason);
  EXPECT_FALSE(a.keep_alive.step());  // the keep-alive is over
}

TEST(KeepAlive, DeclaresTheStoreLostAtOnceWhenItsPortRefuses) {
  auto store = std::make_shared<FlakyStore>();
  FakeClock clock;
  Node a(store, "a", clock);
  EXPECT_TRUE(a.keep_alive.step());
  store->failure = FlakyStore::Failure::kRefused;
  clock.advance(500ms);
  EXPECT_TRUE(a.keep_alive.step());
  EXPECT_NE(a.loss.reason().find("closed its connection and refuses new ones (0.5 s"),
            std::string::npos)
      << a.loss.reason();
}

TEST(KeepAlive, WaitsOutAnOutageOfAStoreOutsideEveryAgent) {
  auto store = std::make_shared<FlakyStore>();
  FakeClock clock;
  Node a(store, "a", clock, /*store_dies_with_host=*/false);  // etcd
  EXPECT_TRUE(a.keep_alive.step());
  store->failure = FlakyStore::Failure::kRefused;
  for (int i = 0; i < 10; ++i) {
    clock.advance(10s);
    EXPECT_TRUE(a.keep_alive.step());
  }
  EXPECT_EQ(a.loss.reason(), "");
  store->failure = FlakyStore::Failure::kNone;
  EXPECT_TRUE(a.keep_alive.step());
}

TEST(KeepAlive, ReportsASilentNeighbourWithTheVerdictThenTheEvent) {
  auto store = std::make_shared<InMemoryStore>();
  FakeClock clock;
  Node a(store, "a", clock), b(store, "b", clock);
  a.keep_alive.watch_round(2, 2, 0, {NodeRef{"b", "hb", 1}});
  b.keep_alive.watch_round(2, 2, 1, {NodeRef{"a", "ha", 0}});
  a.verdicts.enter_round(2, 2);
  EXPECT_TRUE(a.keep_alive.step());
  EXPECT_TRUE(b.keep_alive.step());  // b's last beat
  const std::string verdict_key = kPrefix + "/round/2/verdict";
  for (int i = 0; i < 5; ++i) {
    clock.advance(1s);
    EXPECT_TRUE(a.keep_alive.step());
    if (i < 2) {
      EXPECT_FALSE(store->check({verdict_key})) << i;  // within the window
    }
  }
  const std::string reason = "node hb (node rank 1) lost (no keep-alive for 3 s)";
  ASSERT_EQ(value(*store, verdict_key), "L|" + reason + "|a");  // else settle() would wait
  auto event = decode_event(store->get(event_key(kPrefix, 2)));
  ASSERT_TRUE(event);
  EXPECT_EQ(event->kind, RendezvousEvent::Kind::kMembershipChanged);
  EXPECT_EQ(event->origin, "a");
  EXPECT_EQ(event->reason, reason);
  // This node's workers failed too (their peer is gone): the failure is free.
  auto settled = a.verdicts.settle();
  EXPECT_EQ(settled.kind, FailureVerdict::Kind::kNodeLost);
  EXPECT_EQ(settled.reason, reason);
}

TEST(KeepAlive, ALeavingNodeTellsTheOthersAndAcksNoFailure) {
  auto store = std::make_shared<InMemoryStore>();
  FakeClock clock;
  Node a(store, "a", clock);
  a.keep_alive.watch_round(0, 3, 2, {});
  a.verdicts.enter_round(0, 3);
  EXPECT_TRUE(a.keep_alive.step());
  a.keep_alive.begin_leaving();
  EXPECT_TRUE(a.keep_alive.step());
  const std::string reason = "node ha (node rank 2) left";
  EXPECT_EQ(value(*store, kPrefix + "/round/0/verdict"), "L|" + reason + "|a");
  auto event = decode_event(store->get(event_key(kPrefix, 0)));
  ASSERT_TRUE(event);
  EXPECT_EQ(event->kind, RendezvousEvent::Kind::kMembershipChanged);
  EXPECT_EQ(event->reason, reason);
  a.verdicts.ack();  // its own leaving fails the others' workers: not its failure
  EXPECT_FALSE(store->check({kPrefix + "/round/0/acks"}));
}

TEST(KeepAlive, StopMarksThisNodeAsLeftAndTellsTheRound) {
  auto store = std::make_shared<InMemoryStore>();
  FakeClock clock;
  Node a(store, "a", clock);
  a.keep_alive.watch_round(1, 2, 0, {NodeRef{"b", "hb", 1}});
  EXPECT_TRUE(a.keep_alive.step());
  a.keep_alive.stop();
  EXPECT_TRUE(store->check({kPrefix + "/left/a"}));
  EXPECT_EQ(value(*store, kPrefix + "/round/1/verdict"), "L|node ha (node rank 0) left|a");
  EXPECT_FALSE(a.keep_alive.step());
  a.keep_alive.stop();  // idempotent
}

}  // namespace
}  // namespace dlaunch
