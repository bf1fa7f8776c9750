#include "launcher/process/worker_group.h"

#include <gtest/gtest.h>

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

WorkerGroup make_group(int n) {
  std::vector<WorkerRecord> ws(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    ws[static_cast<size_t>(i)].local_rank = i;
    ws[static_cast<size_t>(i)].global_rank = 10 + i;
  }
  return WorkerGroup(0, std::move(ws));
}

const auto kWall = std::chrono::system_clock::time_point{};

TEST(WorkerGroup, InitToHealthyToSucceeded) {
  FakeClock clock;
  auto g = make_group(2);
  EXPECT_EQ(g.state(), GroupState::kInit);
  g.on_started(0, 100, clock.now(), kWall);
  EXPECT_EQ(g.state(), GroupState::kInit);
  g.on_started(1, 101, clock.now(), kWall);
  EXPECT_EQ(g.state(), GroupState::kHealthy);
  g.on_exit(1, ExitStatus::exited(0), clock.now(), kWall);
  EXPECT_EQ(g.state(), GroupState::kHealthy);
  EXPECT_FALSE(g.all_exited());
  g.on_exit(0, ExitStatus::exited(0), clock.now(), kWall);
  EXPECT_EQ(g.state(), GroupState::kSucceeded);
  EXPECT_TRUE(g.all_exited());
  EXPECT_FALSE(g.root_cause());
}

TEST(WorkerGroup, FirstFailureIsTheRootCauseAndLaterOnesAreConsequences) {
  FakeClock clock;
  auto g = make_group(3);
  for (int i = 0; i < 3; ++i) g.on_started(i, 100 + i, clock.now(), kWall);
  clock.advance(1s);
  g.on_exit(2, ExitStatus::killed(11), clock.now(), kWall);
  EXPECT_EQ(g.state(), GroupState::kFailed);
  ASSERT_TRUE(g.root_cause());
  EXPECT_EQ(*g.root_cause(), 2);
  clock.advance(1s);
  g.on_exit(0, ExitStatus::exited(1), clock.now(), kWall);   // e.g. a broken collective
  g.on_exit(1, ExitStatus::killed(15), clock.now(), kWall);  // our SIGTERM
  EXPECT_EQ(*g.root_cause(), 2);
  EXPECT_EQ(g.worker(0).state, WorkerState::kStopped);
  EXPECT_EQ(g.worker(2).state, WorkerState::kFailed);
  EXPECT_TRUE(g.all_exited());
}

TEST(WorkerGroup, HangMakesUnhealthyAndIsFinal) {
  FakeClock clock;
  auto g = make_group(2);
  g.on_started(0, 1, clock.now(), kWall);
  g.on_started(1, 2, clock.now(), kWall);
  g.on_hung(1, clock.now(), kWall);
  EXPECT_EQ(g.state(), GroupState::kUnhealthy);
  EXPECT_EQ(*g.root_cause(), 1);
  EXPECT_TRUE(g.worker(1).hung);
  g.on_exit(0, ExitStatus::exited(2), clock.now(), kWall);
  EXPECT_EQ(g.state(), GroupState::kUnhealthy);
  EXPECT_EQ(*g.root_cause(), 1);
}

// The stacks showed that rank 1 is stuck and rank 0 only waits for it in a collective.
TEST(WorkerGroup, BlameHangMovesTheRootCauseToTheStuckWorker) {
  FakeClock clock;
  auto g = make_group(3);
  for (int64_t lr = 0; lr < 3; ++lr) g.on_started(lr, 10 + static_cast<int>(lr), clock.now(), kWall);
  g.on_hung(0, clock.now(), kWall);
  g.blame_hang(1);
  EXPECT_EQ(g.state(), GroupState::kUnhealthy);
  EXPECT_EQ(*g.root_cause(), 1);
  EXPECT_TRUE(g.worker(1).hung);
  // Only while Unhealthy: a failed group keeps its root cause.
  auto f = make_group(2);
  f.on_started(0, 1, clock.now(), kWall);
  f.on_started(1, 2, clock.now(), kWall);
  f.on_exit(0, ExitStatus::exited(1), clock.now(), kWall);
  f.blame_hang(1);
  EXPECT_EQ(*f.root_cause(), 0);
}

TEST(WorkerGroup, StopRequestKeepsAFinalState) {
  FakeClock clock;
  auto g = make_group(1);
  g.on_started(0, 1, clock.now(), kWall);
  g.on_stop_requested("SIGTERM");
  EXPECT_EQ(g.state(), GroupState::kStopped);
  g.on_exit(0, ExitStatus::killed(15), clock.now(), kWall);
  EXPECT_EQ(g.state(), GroupState::kStopped);
  EXPECT_FALSE(g.root_cause());
  auto h = make_group(1);
  h.on_started(0, 1, clock.now(), kWall);
  h.on_exit(0, ExitStatus::exited(3), clock.now(), kWall);
  h.on_stop_requested("late");
  EXPECT_EQ(h.state(), GroupState::kFailed);
}

TEST(WorkerGroup, AbandonedWorkersCountAsGone) {
  FakeClock clock;
  auto g = make_group(1);
  g.on_started(0, 1, clock.now(), kWall);
  g.on_stop_requested("x");
  EXPECT_FALSE(g.all_exited());
  g.on_abandoned(0);
  EXPECT_TRUE(g.all_exited());
}

TEST(WorkerGroup, StderrTailIsBounded) {
  auto g = make_group(1);
  for (int i = 0; i < 200; ++i) g.add_stderr_line(0, std::to_string(i));
  EXPECT_EQ(g.worker(0).stderr_tail.size(), WorkerGroup::kTailLines);
  EXPECT_EQ(g.worker(0).stderr_tail.back(), "199");
}

TEST(WorkerGroup, HangRule) {
  FakeClock clock;
  TimePoint start = clock.now();
  for (bool from_start : {false, true}) {
    EXPECT_FALSE(WorkerGroup::is_hung(start, start + 500ms, start + 1400ms, 1s, from_start));
    EXPECT_TRUE(WorkerGroup::is_hung(start, start + 500ms, start + 1600ms, 1s, from_start));
  }
  // --hang_timeout_from_start: the start counts as the first beat.
  EXPECT_FALSE(WorkerGroup::is_hung(start, std::nullopt, start + 900ms, 1s, true));
  EXPECT_TRUE(WorkerGroup::is_hung(start, std::nullopt, start + 1100ms, 1s, true));
  // A beat stamped before the start (the file clock lags the agent's) counts as made at the
  // start: hung a timeout later, with or without --hang_timeout_from_start.
  for (bool from_start : {false, true}) {
    EXPECT_FALSE(WorkerGroup::is_hung(start, start - 3ms, start + 900ms, 1s, from_start));
    EXPECT_TRUE(WorkerGroup::is_hung(start, start - 3ms, start + 1100ms, 1s, from_start));
  }
}

TEST(WorkerGroup, WorkerThatNeverBeatIsNotHungByDefault) {
  FakeClock clock;
  TimePoint start = clock.now();
  EXPECT_FALSE(WorkerGroup::is_hung(start, std::nullopt, start + 1h, 1s, false));
}

// A worker replaced alone: its failure is recorded, the group stays Healthy, and the record
// starts over for the replacement, which the group's success then waits for.
TEST(WorkerGroup, AReplacedWorkerFailsAloneAndItsRecordStartsOver) {
  FakeClock clock;
  auto g = make_group(3);
  for (int i = 0; i < 3; ++i) g.on_started(i, 100 + i, clock.now(), kWall);
  g.worker(1).error_file = "/run/1/error.json";
  ASSERT_TRUE(g.begin_replacement(1));
  EXPECT_FALSE(g.begin_replacement(1));  // once
  g.on_exit(1, ExitStatus::exited(1), clock.now(), kWall);
  EXPECT_EQ(g.state(), GroupState::kHealthy);
  EXPECT_FALSE(g.root_cause());
  EXPECT_EQ(g.worker(1).state, WorkerState::kFailed);
  EXPECT_FALSE(g.all_exited());

  g.restart_worker(1);
  ASSERT_EQ(g.replaced().size(), 1u);
  EXPECT_EQ(g.replaced()[0].pid, 101);
  EXPECT_EQ(g.replaced()[0].exit->code, 1);
  const WorkerRecord& w = g.worker(1);
  EXPECT_EQ(w.state, WorkerState::kInit);
  EXPECT_EQ(w.pid, -1);
  EXPECT_FALSE(w.exit);
  EXPECT_FALSE(w.replacing);
  EXPECT_TRUE(w.replacement);
  EXPECT_EQ(w.replacements, 1);
  EXPECT_EQ(w.global_rank, 11);
  EXPECT_EQ(w.error_file, "/run/1/error.json");

  g.on_started(1, 200, clock.now(), kWall);
  EXPECT_EQ(g.state(), GroupState::kHealthy);
  for (int i : {0, 2}) g.on_exit(i, ExitStatus::exited(0), clock.now(), kWall);
  EXPECT_EQ(g.state(), GroupState::kHealthy);  // the replacement still runs
  g.on_exit(1, ExitStatus::exited(0), clock.now(), kWall);
  EXPECT_EQ(g.state(), GroupState::kSucceeded);
}

TEST(WorkerGroup, AHungWorkerReplacedAloneMakesTheGroupHealthyAgain) {
  FakeClock clock;
  auto g = make_group(2);
  g.on_started(0, 1, clock.now(), kWall);
  g.on_started(1, 2, clock.now(), kWall);
  g.on_hung(1, clock.now(), kWall);
  ASSERT_EQ(g.state(), GroupState::kUnhealthy);
  EXPECT_FALSE(g.begin_replacement(0));  // not the hung one
  ASSERT_TRUE(g.begin_replacement(1));
  EXPECT_EQ(g.state(), GroupState::kHealthy);
  EXPECT_FALSE(g.root_cause());
  g.on_exit(1, ExitStatus::killed(9), clock.now(), kWall);  // our SIGKILL
  EXPECT_EQ(g.state(), GroupState::kHealthy);
  g.restart_worker(1);
  EXPECT_TRUE(g.replaced()[0].hung);
  EXPECT_FALSE(g.worker(1).hung);
}

// The silent workers here only waited for a rank stuck on another node, which that node replaces
// alone: the group is healthy again, and a later failure is its own root cause.
TEST(WorkerGroup, AHangForgivenMakesTheGroupHealthyAgain) {
  FakeClock clock;
  auto g = make_group(2);
  g.on_started(0, 1, clock.now(), kWall);
  g.on_started(1, 2, clock.now(), kWall);
  g.on_hung(0, clock.now(), kWall);
  ASSERT_EQ(g.state(), GroupState::kUnhealthy);
  g.forgive_hang();
  EXPECT_EQ(g.state(), GroupState::kHealthy);
  EXPECT_FALSE(g.root_cause());
  EXPECT_FALSE(g.worker(0).hung);
  g.on_exit(1, ExitStatus::exited(1), clock.now(), kWall);
  EXPECT_EQ(g.state(), GroupState::kFailed);
  EXPECT_EQ(g.root_cause(), 1);
  g.forgive_hang();  // only a hang is forgiven
  EXPECT_EQ(g.state(), GroupState::kFailed);
}

TEST(WorkerGroup, AReplacementThatCannotStartFailsTheGroup) {
  FakeClock clock;
  auto g = make_group(2);
  g.on_started(0, 1, clock.now(), kWall);
  g.on_started(1, 2, clock.now(), kWall);
  ASSERT_TRUE(g.begin_replacement(0));
  g.on_exit(0, ExitStatus::exited(3), clock.now(), kWall);
  g.replacement_failed(0);
  EXPECT_EQ(g.state(), GroupState::kFailed);
  EXPECT_EQ(g.root_cause(), std::optional<int64_t>(0));
  EXPECT_FALSE(g.worker(0).replacing);
}

TEST(WorkerGroup, NoReplacementOnceTheGroupIsFinal) {
  FakeClock clock;
  auto g = make_group(2);
  g.on_started(0, 1, clock.now(), kWall);
  g.on_started(1, 2, clock.now(), kWall);
  g.on_exit(0, ExitStatus::exited(1), clock.now(), kWall);
  EXPECT_FALSE(g.begin_replacement(1));
  g.on_stop_requested("signal");
  EXPECT_FALSE(g.begin_replacement(1));
}


// A shrink in place renumbers the running workers; the replaced records keep their ranks, and a
// replacement started afterwards has the new one.
TEST(WorkerGroup, RenumberGivesTheNewRanksToTheRecordsInUse) {
  FakeClock clock;
  auto g = make_group(2);
  for (int i = 0; i < 2; ++i) g.on_started(i, 100 + i, clock.now(), kWall);
  ASSERT_TRUE(g.begin_replacement(1));
  g.on_exit(1, ExitStatus::exited(1), clock.now(), kWall);
  g.restart_worker(1);
  g.on_started(1, 200, clock.now(), kWall);
  g.renumber(4);
  EXPECT_EQ(g.worker(0).global_rank, 4);
  EXPECT_EQ(g.worker(1).global_rank, 5);
  EXPECT_EQ(g.replaced()[0].global_rank, 11);
  EXPECT_EQ(g.state(), GroupState::kHealthy);
}

}  // namespace
}  // namespace dlaunch
