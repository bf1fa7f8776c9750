// The stop watchdog's rules (worker/train/stop_watchdog.h) on a scripted clock: when a worker
// that got a stop signal is given up on, and when it never is.
#include "worker/train/stop_watchdog.h"

#include <gtest/gtest.h>

namespace dlaunch::train {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class StopWatchdogTest : public ::testing::Test {
 protected:
  // `n` steps of `each`, ending now.
  void steps(StopWatchdog& dog, int n, Duration each) {
    for (int i = 0; i < n; ++i) {
      clock_.advance(each);
      dog.progress(/*step=*/true);
    }
  }
  FakeClock clock_{TimePoint{} + seconds(100)};
};

TEST_F(StopWatchdogTest, NothingToWatchUntilAStopIsRequested) {
  StopWatchdog dog(clock_, 1, seconds(5));
  dog.progress(true);
  steps(dog, 5, milliseconds(100));
  EXPECT_FALSE(dog.deadline().has_value());
  EXPECT_FALSE(dog.requested_at().has_value());
}

TEST_F(StopWatchdogTest, FastStepsGetTheFloor) {
  StopWatchdog dog(clock_, 1, seconds(5));
  dog.progress(true);
  steps(dog, 5, milliseconds(100));  // (1 + 2) x 0.1 s = 0.3 s, below the floor
  clock_.advance(milliseconds(30));
  const TimePoint requested = clock_.now();
  dog.stop_requested();
  ASSERT_TRUE(dog.deadline().has_value());
  EXPECT_EQ(*dog.deadline(), requested + StopWatchdog::kFloor);
  EXPECT_EQ(dog.bound(), StopWatchdog::kFloor);
  EXPECT_NE(dog.explain_bound().find("raised to the 1.0 s floor"), std::string::npos)
      << dog.explain_bound();
}

TEST_F(StopWatchdogTest, BoundIsStepsPerCheckPlusTwoSteps) {
  StopWatchdog dog(clock_, 4, seconds(30));
  dog.progress(true);
  steps(dog, 3, milliseconds(500));
  dog.stop_requested();
  EXPECT_EQ(dog.bound(), seconds(3));  // (4 + 2) x 0.5 s
  EXPECT_EQ(*dog.deadline(), clock_.now() + seconds(3));
  EXPECT_EQ(dog.explain_bound(), "6 x the longest recent step (0.50 s) = 3.00 s");
}

TEST_F(StopWatchdogTest, NeverMoreThanTheGraceShare) {
  StopWatchdog dog(clock_, 1, seconds(5));
  dog.progress(true);
  steps(dog, 3, seconds(2));  // 6 s > 80% of the 5 s grace
  dog.stop_requested();
  EXPECT_EQ(dog.bound(), seconds(4));
  EXPECT_NE(dog.explain_bound().find("capped at 80% of the launcher's 5.0 s grace"),
            std::string::npos)
      << dog.explain_bound();
  // A grace shorter than the floor wins over the floor.
  StopWatchdog tight(clock_, 1, milliseconds(500));
  tight.progress(true);
  steps(tight, 3, milliseconds(10));
  EXPECT_EQ(tight.bound(), milliseconds(400));
}

TEST_F(StopWatchdogTest, BeforeAnyTimedStepTheGraceShareOrNothing) {
  StopWatchdog dog(clock_, 1, seconds(10));
  dog.progress(true);  // one step ended: no interval yet
  dog.stop_requested();
  EXPECT_EQ(*dog.deadline(), clock_.now() + seconds(8));
  EXPECT_NE(dog.explain_bound().find("no step timed yet"), std::string::npos);
  // Alone (no launcher's grace) nothing bounds the wait before a step is timed.
  StopWatchdog alone(clock_, 1, std::nullopt);
  alone.stop_requested();
  EXPECT_FALSE(alone.deadline().has_value());
  alone.progress(true);
  steps(alone, 1, seconds(2));
  EXPECT_EQ(alone.bound(), seconds(6));  // no cap without a grace
}

TEST_F(StopWatchdogTest, ProgressAfterTheRequestRestartsTheWait) {
  StopWatchdog dog(clock_, 1, seconds(30));
  dog.progress(true);
  steps(dog, 3, seconds(1));  // bound 3 s
  clock_.advance(milliseconds(200));
  const TimePoint requested = clock_.now();
  dog.stop_requested();
  EXPECT_EQ(*dog.deadline(), requested + seconds(3)) << "progress before the request is no excuse";
  clock_.advance(seconds(2));
  dog.progress(/*step=*/false);  // an evaluation batch
  EXPECT_EQ(*dog.deadline(), clock_.now() + seconds(3));
  // A repeated signal does not move the request.
  clock_.advance(seconds(1));
  dog.stop_requested();
  EXPECT_EQ(dog.requested_at(), requested);
}

TEST_F(StopWatchdogTest, SettledWorkersAreNeverGivenUpOn) {
  StopWatchdog dog(clock_, 1, seconds(5));
  dog.progress(true);
  steps(dog, 3, milliseconds(100));
  dog.stop_requested();
  ASSERT_TRUE(dog.deadline().has_value());
  dog.settle();
  clock_.advance(seconds(60));
  EXPECT_FALSE(dog.deadline().has_value());
}

TEST_F(StopWatchdogTest, StepTimeIsTheLongestOfTheRecentStepsWithoutEvaluation) {
  StopWatchdog dog(clock_, 1, std::nullopt);
  dog.progress(true);
  steps(dog, 1, seconds(2));  // one slow step, then fast ones
  steps(dog, StopWatchdog::kStepsKept - 1, milliseconds(100));
  EXPECT_EQ(dog.bound(), seconds(6)) << "still among the last kStepsKept";
  steps(dog, 1, milliseconds(100));
  EXPECT_EQ(dog.bound(), StopWatchdog::kFloor) << "forgotten after kStepsKept faster ones";
  // An evaluation between two steps: that interval is not a step.
  clock_.advance(seconds(20));
  dog.progress(/*step=*/false);
  steps(dog, 1, milliseconds(100));
  steps(dog, 1, milliseconds(100));
  EXPECT_EQ(dog.bound(), StopWatchdog::kFloor);
}

}  // namespace
}  // namespace dlaunch::train
