// Failure verdicts alone, over an in-memory store: the nodes of a round ack a failure, the
// node completing the count charges it once, a keep-alive's "lost" verdict makes it free and
// holds, and a declared store loss ends a settle at once.
#include "rendezvous/handlers/failure_verdicts.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "rendezvous/store/in_memory_store.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

const std::string kPrefix = "dlaunch/rdzv/job1";

// One node's verdicts and store loss, over the job's shared store.
struct Node {
  Node(std::shared_ptr<Store> store, const std::string& id, const Clock& clock,
       Duration interval = 1s)
      : loss(store),
        verdicts(FailureVerdicts::Settings{"job1", kPrefix, id, interval, 3}, store, loss, clock) {}
  StoreLoss loss;
  FailureVerdicts verdicts;
};

int64_t restart_count(Store& store) {
  return store.add(kPrefix + "/restart_count", 0);
}
std::string verdict(Store& store, int64_t round) {
  const std::string key = kPrefix + "/round/" + std::to_string(round) + "/verdict";
  return store.check({key}) ? to_string(store.get(key)) : std::string("(none)");
}

TEST(FailureVerdicts, EveryNodeAckingChargesTheRestartOnce) {
  auto store = std::make_shared<InMemoryStore>();
  FakeClock clock;
  Node a(store, "a", clock), b(store, "b", clock);
  a.verdicts.enter_round(0, 2);
  b.verdicts.enter_round(0, 2);
  a.verdicts.ack();
  a.verdicts.ack();  // the watcher and the failure report: one count
  EXPECT_FALSE(store->check({kPrefix + "/round/0/verdict"}));
  b.verdicts.ack();                      // completes the count: every node is alive
  ASSERT_EQ(verdict(*store, 0), "C|b");  // else settle() would wait for it (a scripted clock)
  EXPECT_EQ(a.verdicts.settle().kind, FailureVerdict::Kind::kCharged);
  EXPECT_EQ(b.verdicts.settle().kind, FailureVerdict::Kind::kCharged);
  EXPECT_EQ(restart_count(*store), 1);
}

TEST(FailureVerdicts, ALostVerdictMakesTheFailureFreeNamesTheNodeAndHolds) {
  auto store = std::make_shared<InMemoryStore>();
  FakeClock clock;
  Node a(store, "a", clock), b(store, "b", clock), observer(store, "o", clock);
  a.verdicts.enter_round(4, 3);
  b.verdicts.enter_round(4, 3);
  observer.verdicts.enter_round(4, 3);
  a.verdicts.ack();
  const std::string reason = "node h2 (node rank 2) lost (no keep-alive for 3 s)";
  ASSERT_TRUE(observer.verdicts.write(*store, 4, "L|" + reason));
  auto v = a.verdicts.settle();
  EXPECT_EQ(v.kind, FailureVerdict::Kind::kNodeLost);
  EXPECT_EQ(v.reason, reason);
  // The count completing later charges nothing: the first verdict of a round holds.
  b.verdicts.ack();
  observer.verdicts.ack();
  EXPECT_EQ(b.verdicts.settle().reason, reason);
  EXPECT_EQ(restart_count(*store), 0);
}

// What the event watcher asks of a membership change: is the round's verdict "lost" now?
TEST(FailureVerdicts, NodeLostNowReadsTheRoundsVerdictWithoutAckingOrWaiting) {
  auto store = std::make_shared<InMemoryStore>();
  FakeClock clock;
  Node a(store, "a", clock), observer(store, "o", clock);
  EXPECT_FALSE(a.verdicts.node_lost_now());  // no round yet
  a.verdicts.enter_round(2, 3);
  EXPECT_FALSE(a.verdicts.node_lost_now());  // no verdict (a node asking in)
  EXPECT_FALSE(store->check({kPrefix + "/round/2/acks"}));
  ASSERT_TRUE(observer.verdicts.write(*store, 2, "L|node h2 (node rank 2) left"));
  EXPECT_TRUE(a.verdicts.node_lost_now());
  Node b(store, "b", clock);
  b.verdicts.enter_round(3, 2);
  ASSERT_TRUE(observer.verdicts.write(*store, 3, "C"));
  EXPECT_FALSE(b.verdicts.node_lost_now());  // charged: a failure, not a loss
}

TEST(FailureVerdicts, NoVerdictWithinTheBudgetIsCharged) {
  auto store = std::make_shared<InMemoryStore>();
  // The budget is the keep-alive window and two intervals: 5 x 20 ms of the real clock.
  Node a(store, "a", steady_clock(), 20ms);
  a.verdicts.enter_round(0, 2);  // the other node never acks, and nobody rules it lost
  EXPECT_EQ(a.verdicts.settle().kind, FailureVerdict::Kind::kCharged);
  EXPECT_EQ(verdict(*store, 0), "C|a");
  EXPECT_EQ(restart_count(*store), 1);
}

TEST(FailureVerdicts, ANodeWritesARoundsVerdictOnce) {
  auto store = std::make_shared<InMemoryStore>();
  FakeClock clock;
  Node a(store, "a", clock);
  EXPECT_TRUE(a.verdicts.write(*store, 0, "C"));
  // Its own value again (a second thread, a retry): not a second charge.
  EXPECT_FALSE(a.verdicts.write(*store, 0, "C"));
  EXPECT_TRUE(a.verdicts.write(*store, 1, "C"));
  EXPECT_EQ(restart_count(*store), 2);
}

TEST(FailureVerdicts, ALeavingNodeAcksNoFailure) {
  auto store = std::make_shared<InMemoryStore>();
  FakeClock clock;
  Node a(store, "a", clock);
  a.verdicts.enter_round(0, 1);
  a.verdicts.begin_leaving();
  a.verdicts.ack();
  EXPECT_FALSE(store->check({kPrefix + "/round/0/acks"}));
  EXPECT_FALSE(store->check({kPrefix + "/round/0/verdict"}));
}

TEST(FailureVerdicts, ADeclaredStoreLossEndsTheSettleAtOnce) {
  auto store = std::make_shared<InMemoryStore>();
  FakeClock clock;
  Node a(store, "a", clock);
  a.verdicts.enter_round(0, 2);
  a.loss.declare("the store at 10.0.0.1:29400 is gone");
  auto v = a.verdicts.settle();
  EXPECT_EQ(v.kind, FailureVerdict::Kind::kStoreLost);
  EXPECT_EQ(v.reason, "the store at 10.0.0.1:29400 is gone");
  EXPECT_THROW(a.verdicts.ack(), ConnectionError);
  EXPECT_FALSE(store->check({kPrefix + "/round/0/acks"}));
}

TEST(StoreLoss, TellsTheCallbackOnceAndALateCallerGetsTheReason) {
  StoreLoss loss(std::make_shared<InMemoryStore>());
  std::vector<RendezvousEvent> told;
  EXPECT_EQ(loss.tell([&](const RendezvousEvent& e) { told.push_back(e); }), "");
  loss.declare("first");
  loss.declare("second");  // the first declaration holds
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].kind, RendezvousEvent::Kind::kStoreLost);
  EXPECT_EQ(told[0].reason, "first");
  EXPECT_EQ(loss.reason(), "first");
  EXPECT_EQ(loss.tell(nullptr), "first");
  loss.wait_for(1h);  // returns at once: declared
}

}  // namespace
}  // namespace dlaunch
