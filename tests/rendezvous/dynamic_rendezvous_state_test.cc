// The dynamic rendezvous state machine as pure functions, driven by a scripted clock.
#include "rendezvous/handlers/dynamic_rendezvous_state.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "rendezvous/handlers/version_mix.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;
using S = DynamicState::Status;

class DecideJoin : public ::testing::Test {
 protected:
  FakeClock clock{TimePoint{} + 1000s};
  DynamicLimits limits{2, 4, 1s};
  DynamicNodeView view;
  JoinDecision decide(const std::optional<DynamicState>& s) {
    return decide_join(s, view, limits, clock.now());
  }
  void joined(int64_t round, int64_t index, int64_t arrivals) {
    view.joined_round = round;
    view.arrival_index = index;
    view.arrivals = arrivals;
    view.arrivals_changed_at = clock.now();
  }
};

TEST_F(DecideJoin, CreatesTheRecordWhenThereIsNone) {
  auto d = decide(std::nullopt);
  EXPECT_EQ(d.step, JoinStep::kCreate);
  EXPECT_EQ(d.next, (DynamicState{0, S::kOpen, 0}));
}

TEST_F(DecideJoin, JoinsAnOpenRoundItIsNotIn) {
  EXPECT_EQ(decide(DynamicState{3, S::kOpen, 0}).step, JoinStep::kJoin);
  joined(2, 1, 1);  // joined an older round
  EXPECT_EQ(decide(DynamicState{3, S::kOpen, 0}).step, JoinStep::kJoin);
}

TEST_F(DecideJoin, CompletesAtMaxAtOnce) {
  joined(0, 4, 4);
  auto d = decide(DynamicState{0, S::kOpen, 0});
  EXPECT_EQ(d.step, JoinStep::kComplete);
  EXPECT_EQ(d.participants, 4);
  EXPECT_EQ(d.next, (DynamicState{0, S::kComplete, 4}));
  joined(0, 2, 6);  // more arrived than MAX: the first MAX are the round
  EXPECT_EQ(decide(DynamicState{0, S::kOpen, 0}).participants, 4);
}

TEST_F(DecideJoin, BelowMinWaitsWithoutDeadline) {
  joined(0, 1, 1);
  clock.advance(1h);
  auto d = decide(DynamicState{0, S::kOpen, 0});
  EXPECT_EQ(d.step, JoinStep::kWait);
  EXPECT_EQ(d.wake_at, TimePoint::max());
}

TEST_F(DecideJoin, AtMinCompletesOnlyAfterLastCallWithoutNewArrivals) {
  joined(0, 1, 2);
  auto d = decide(DynamicState{0, S::kOpen, 0});
  EXPECT_EQ(d.step, JoinStep::kWait);
  EXPECT_EQ(d.wake_at, clock.now() + 1s);
  clock.advance(999ms);
  EXPECT_EQ(decide(DynamicState{0, S::kOpen, 0}).step, JoinStep::kWait);
  // A third node arrives: the last call starts over.
  view.arrivals = 3;
  view.arrivals_changed_at = clock.now();
  clock.advance(500ms);
  EXPECT_EQ(decide(DynamicState{0, S::kOpen, 0}).step, JoinStep::kWait);
  clock.advance(500ms);
  d = decide(DynamicState{0, S::kOpen, 0});
  EXPECT_EQ(d.step, JoinStep::kComplete);
  EXPECT_EQ(d.participants, 3);
}

// After a loss the agents that kept their workers say whom they expect (expect_nodes): once
// they are all back the round completes without its last call; fewer (another node lost
// meanwhile) complete by the last call as usual, and never below MIN.
TEST_F(DecideJoin, ExpectedNodesCompleteWithoutTheLastCall) {
  view.expected_arrivals = 3;
  joined(1, 1, 2);
  EXPECT_EQ(decide(DynamicState{1, S::kOpen, 0}).step, JoinStep::kWait);
  view.arrivals = 3;
  view.arrivals_changed_at = clock.now();
  auto d = decide(DynamicState{1, S::kOpen, 0});
  EXPECT_EQ(d.step, JoinStep::kComplete);
  EXPECT_EQ(d.participants, 3);
  EXPECT_EQ(d.next, (DynamicState{1, S::kComplete, 3}));

  joined(1, 1, 2);  // one of the three expected never comes: the last call as usual
  EXPECT_EQ(decide(DynamicState{1, S::kOpen, 0}).step, JoinStep::kWait);
  clock.advance(1s);
  EXPECT_EQ(decide(DynamicState{1, S::kOpen, 0}).participants, 2);

  view.expected_arrivals = 1;  // below MIN (2): waits for MIN, then the last call
  joined(1, 1, 1);
  EXPECT_EQ(decide(DynamicState{1, S::kOpen, 0}).step, JoinStep::kWait);
}

TEST_F(DecideJoin, ParticipantOfACompletedRoundIsDone) {
  joined(5, 2, 3);
  EXPECT_EQ(decide(DynamicState{5, S::kComplete, 3}).step, JoinStep::kDone);
}

TEST_F(DecideJoin, NodeThatRanTheRoundOpensTheNextWhenItComesBack) {
  joined(5, 2, 3);
  view.last_round = 5;
  auto d = decide(DynamicState{5, S::kComplete, 3});
  EXPECT_EQ(d.step, JoinStep::kOpenNext);
  EXPECT_EQ(d.next, (DynamicState{6, S::kOpen, 0}));
}

TEST_F(DecideJoin, LateArrivalWaitsForTheNextRoundUnlessTheRunningGroupIsDead) {
  EXPECT_EQ(decide(DynamicState{5, S::kComplete, 3}).step, JoinStep::kJoin);
  joined(5, 4, 4);  // arrival 4 of a round fixed at 3
  EXPECT_EQ(decide(DynamicState{5, S::kComplete, 3}).step, JoinStep::kWaitNextRound);
  view.running_round_dead = true;
  auto d = decide(DynamicState{5, S::kComplete, 3});
  EXPECT_EQ(d.step, JoinStep::kOpenNext);
  EXPECT_EQ(d.next.round, 6);
}

TEST_F(DecideJoin, ClosedIsFinal) {
  joined(1, 1, 1);
  EXPECT_EQ(decide(DynamicState{1, S::kClosed, 0}).step, JoinStep::kClosed);
}

TEST(DynamicState, RoundTripsAndRejectsGarbage) {
  DynamicState s{12, S::kComplete, 7};
  EXPECT_EQ(DynamicState::decode(s.encode()), s);
  EXPECT_FALSE(DynamicState::decode(Bytes()).has_value());
  EXPECT_THROW(DynamicState::decode(to_bytes("v1 round=x status=open n=0")), ProtocolError);
  EXPECT_THROW(DynamicState::decode(to_bytes("hello")), ProtocolError);
  NodeDescriptor d{"h-1-ab", "[::1]", 8, 3};
  auto back = NodeDescriptor::decode(d.encode());
  EXPECT_EQ(back.id, d.id);
  EXPECT_EQ(back.host, "[::1]");
  EXPECT_EQ(back.local_world_size, 8);
  EXPECT_EQ(back.rank_hint, 3);
  EXPECT_EQ(back.previous_rank, -1);
  d.previous_rank = 5;
  EXPECT_EQ(NodeDescriptor::decode(d.encode()).previous_rank, 5);
  EXPECT_EQ(NodeDescriptor::decode(to_bytes("h-2|10.0.0.2|4|-1")).previous_rank, -1);  // older form
  EXPECT_THROW(NodeDescriptor::decode(to_bytes("nope")), ProtocolError);
}

// The agent's build rides last, after ';', so an agent that predates it still reads the numbers
// (std::stoll stops at the ';'), and a descriptor from such an agent reads as "no version".
TEST(NodeDescriptorVersion, RoundTripsAndOlderFormsStillRead) {
  NodeDescriptor d{"h-1-ab", "10.0.0.1", 4, -1};
  d.version = "0.1.0+3467aab";
  auto back = NodeDescriptor::decode(d.encode());
  EXPECT_EQ(back.version, "0.1.0+3467aab");
  EXPECT_EQ(back.rank_hint, -1);
  EXPECT_EQ(back.previous_rank, -1);
  d.previous_rank = 2;
  back = NodeDescriptor::decode(d.encode());
  EXPECT_EQ(back.version, "0.1.0+3467aab");
  EXPECT_EQ(back.previous_rank, 2);
  EXPECT_EQ(NodeDescriptor::decode(to_bytes("h-2|10.0.0.2|4|1,3")).version, "");
  // What an older agent's decoder does with the new form: stoll on "1,3;v" and "3;v".
  EXPECT_EQ(std::stoll(std::string("1;0.1.0+3467aab")), 1);
  EXPECT_EQ(std::stoll(std::string("3;0.1.0+3467aab")), 3);
}

TEST(VersionMix, SilentWhenAllAgreeOrNothingPublished) {
  EXPECT_EQ(describe_version_mix("0.1.0+a", {{"n1", "0.1.0+a"}, {"n2", "0.1.0+a"}}), "");
  EXPECT_EQ(describe_version_mix("", {{"n1", "0.1.0+a"}, {"n2", "0.2.0+b"}}), "");
}

TEST(VersionMix, NamesEachBuildWithItsHostsAndWhatToDo) {
  std::string m = describe_version_mix(
      "0.1.0+a", {{"n1", "0.1.0+a"}, {"n2", "0.2.0+b"}, {"n3", "0.1.0+a"}, {"n4", ""}});
  EXPECT_NE(m.find("0.1.0+a on n1, n3"), std::string::npos) << m;
  EXPECT_NE(m.find("0.2.0+b on n2"), std::string::npos) << m;
  EXPECT_NE(m.find("an older dlaunch (no version) on n4"), std::string::npos) << m;
  EXPECT_NE(m.find("(this agent: 0.1.0+a)"), std::string::npos) << m;
  EXPECT_NE(m.find("install the same package everywhere"), std::string::npos) << m;
}

TEST(AssignRanks, HonoursUniqueHintsAndFillsTheRestByArrival) {
  auto node = [](const char* id, int64_t hint) { return NodeDescriptor{id, id, 1, hint}; };
  // No hints: arrival order.
  auto r = assign_ranks({node("a", -1), node("b", -1), node("c", -1)});
  EXPECT_EQ(r, (std::vector<size_t>{0, 1, 2}));
  // All hinted, reversed.
  r = assign_ranks({node("a", 2), node("b", 1), node("c", 0)});
  EXPECT_EQ(r, (std::vector<size_t>{2, 1, 0}));
  // A duplicate and an out-of-range hint fall back to arrival order.
  r = assign_ranks({node("a", 1), node("b", 1), node("c", 9), node("d", -1)});
  EXPECT_EQ(r[1], 0u);  // a got its hint
  EXPECT_EQ(r[0], 1u);  // b, c, d fill 0, 2, 3 in arrival order
  EXPECT_EQ(r[2], 2u);
  EXPECT_EQ(r[3], 3u);
}

// A node joining a running job arrives first in the next round (it was already waiting); the
// running nodes must keep their ranks (node 0 stays node 0), and survivors of a node loss keep
// theirs where they still fit.
TEST(AssignRanks, NodesKeepTheirPreviousRankBehindExplicitHints) {
  auto node = [](const char* id, int64_t hint, int64_t previous) {
    NodeDescriptor d{id, id, 1, hint};
    d.previous_rank = previous;
    return d;
  };
  // Scale-up: "new" arrived first, a and b ran as ranks 0 and 1.
  auto r = assign_ranks({node("new", -1, -1), node("b", -1, 1), node("a", -1, 0)});
  EXPECT_EQ(r, (std::vector<size_t>{2, 1, 0}));
  // Scale-down: ranks 0 and 2 survived; 2 no longer fits and takes the free rank 1.
  r = assign_ranks({node("c", -1, 2), node("a", -1, 0)});
  EXPECT_EQ(r, (std::vector<size_t>{1, 0}));
  // An explicit hint wins over a previous rank.
  r = assign_ranks({node("a", -1, 0), node("hinted", 0, -1)});
  EXPECT_EQ(r, (std::vector<size_t>{1, 0}));
}

TEST(WatchedRanks, RingNeighbours) {
  EXPECT_TRUE(watched_ranks(0, 1).empty());
  EXPECT_EQ(watched_ranks(0, 2), (std::vector<int64_t>{1}));
  EXPECT_EQ(watched_ranks(0, 5), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(watched_ranks(4, 5), (std::vector<int64_t>{0, 3}));
}

}  // namespace
}  // namespace dlaunch
