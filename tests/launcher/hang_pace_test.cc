// --hang_timeout auto's pace (launcher/hang/hang_pace.h), with a scripted clock.
#include "launcher/hang/hang_pace.h"

#include <gtest/gtest.h>

#include <chrono>

namespace dlaunch {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

HangPaceParams params() {
  HangPaceParams p;
  p.startup = seconds(300);
  p.floor = seconds(1);
  p.factor = 5;
  p.group_gaps = 20;
  p.worker_gaps = 3;
  return p;
}

constexpr Duration kCheck = milliseconds(100);  // the agent's check period

// `beats` beats of worker `w` (pid `pid`), `every` apart, from the clock's time on, read by a
// check every 100 ms and one right after each beat.
void beat(HangPace& pace, FakeClock& clock, int64_t w, int pid, int beats, Duration every) {
  for (int i = 0; i < beats; ++i) {
    const TimePoint previous = clock.now();
    for (Duration left = every; left > kCheck; left -= kCheck) {
      clock.advance(kCheck);
      pace.observe(w, pid, previous, clock.now());
    }
    clock.set(previous + every);
    pace.observe(w, pid, clock.now(), clock.now());
  }
}

TEST(HangPace, TheStartUpTimeoutAppliesBeforeTheGroupShowedEnoughGaps) {
  FakeClock clock;
  HangPace pace(params());
  pace.observe(0, 100, std::nullopt, clock.now());
  EXPECT_EQ(pace.timeout(0).value, seconds(300));
  beat(pace, clock, 0, 100, 20, milliseconds(50));  // the first beat is no gap: 19 gaps
  HangPace::Timeout t = pace.timeout(0);
  EXPECT_FALSE(t.learned);
  EXPECT_EQ(t.group_gaps, 19);
  EXPECT_EQ(t.value, seconds(300));
  EXPECT_NE(pace.describe(t).find("start-up"), std::string::npos) << pace.describe(t);
}

TEST(HangPace, TheLearnedTimeoutIsTheFactorTimesTheLongestGap) {
  FakeClock clock;
  HangPace pace(params());
  beat(pace, clock, 0, 100, 10, milliseconds(250));
  beat(pace, clock, 1, 101, 12, milliseconds(300));
  HangPace::Timeout t = pace.timeout(1);
  EXPECT_TRUE(t.learned);
  EXPECT_EQ(t.longest_gap, milliseconds(300));
  EXPECT_EQ(t.value, milliseconds(1500));
  EXPECT_EQ(pace.timeout(0).value, milliseconds(1500)) << "the group's longest gap, not its own";
  EXPECT_EQ(pace.describe(t), "--hang_timeout auto: 5 x the longest gap seen, 0.30 s");
}

TEST(HangPace, FastBeatsGetTheFloor) {
  FakeClock clock;
  HangPace pace(params());
  beat(pace, clock, 0, 100, 40, milliseconds(50));
  HangPace::Timeout t = pace.timeout(0);
  EXPECT_TRUE(t.learned);
  EXPECT_EQ(t.value, seconds(1));
  EXPECT_NE(pace.describe(t).find("floor of 1.0 s"), std::string::npos) << pace.describe(t);
}

TEST(HangPace, ALongEvaluationGapRaisesTheTimeout) {
  FakeClock clock;
  HangPace pace(params());
  beat(pace, clock, 0, 100, 6, milliseconds(100));
  beat(pace, clock, 0, 100, 1, seconds(2));  // an epoch-end evaluation without beats
  beat(pace, clock, 0, 100, 20, milliseconds(100));
  HangPace::Timeout t = pace.timeout(0);
  EXPECT_TRUE(t.learned);
  EXPECT_EQ(t.value, seconds(10));
  // Once learned, a gap of up to half the timeout raises it too.
  beat(pace, clock, 0, 100, 1, seconds(4));
  EXPECT_EQ(pace.timeout(0).value, seconds(20));
}

TEST(HangPace, AWorkersFirstGapsAreNotLearned) {
  FakeClock clock;
  HangPace pace(params());
  beat(pace, clock, 0, 100, 1, milliseconds(100));
  beat(pace, clock, 0, 100, 1, seconds(5));  // the first step: warm-up, compilation
  beat(pace, clock, 0, 100, 30, milliseconds(100));
  HangPace::Timeout t = pace.timeout(0);
  EXPECT_TRUE(t.learned);
  EXPECT_EQ(t.longest_gap, milliseconds(100));
  EXPECT_EQ(t.value, seconds(1));
}

// The ranks that waited in a collective for a rank stuck on another node beat again once it is
// replaced: that silence, longer than half the timeout, would raise it for the next hang.
TEST(HangPace, OnceLearnedASilenceLongerThanHalfTheTimeoutIsNotLearned) {
  FakeClock clock;
  HangPace pace(params());
  beat(pace, clock, 0, 100, 30, milliseconds(200));
  ASSERT_EQ(pace.timeout(0).value, seconds(1));
  beat(pace, clock, 0, 100, 1, milliseconds(900));
  beat(pace, clock, 0, 100, 5, milliseconds(200));
  EXPECT_EQ(pace.timeout(0).longest_gap, milliseconds(200));
  EXPECT_EQ(pace.timeout(0).value, seconds(1));
  beat(pace, clock, 0, 100, 1, milliseconds(400));  // within half: learned
  EXPECT_EQ(pace.timeout(0).value, seconds(2));
}

TEST(HangPace, ReReadingTheSameBeatIsNoGap) {
  FakeClock clock;
  HangPace pace(params());
  beat(pace, clock, 0, 100, 30, milliseconds(100));
  const TimePoint last = clock.now();
  for (int i = 0; i < 50; ++i) pace.observe(0, 100, last, last);  // checks faster than beats
  EXPECT_EQ(pace.timeout(0).group_gaps, 29);
  EXPECT_EQ(pace.timeout(0).longest_gap, milliseconds(100));
}

TEST(HangPace, AReplacementGetsTheStartUpTimeoutUntilItBeatItself) {
  FakeClock clock;
  HangPace pace(params());
  beat(pace, clock, 0, 100, 30, milliseconds(100));
  beat(pace, clock, 1, 101, 30, milliseconds(100));
  ASSERT_TRUE(pace.timeout(1).learned);
  pace.observe(1, 202, std::nullopt, clock.now());  // a new pid: the replacement, not beating
  EXPECT_EQ(pace.timeout(1).value, seconds(300));
  beat(pace, clock, 1, 202, 3, milliseconds(100));  // 2 gaps of its own
  EXPECT_FALSE(pace.timeout(1).learned);
  beat(pace, clock, 1, 202, 1, milliseconds(100));
  EXPECT_TRUE(pace.timeout(1).learned);
  EXPECT_EQ(pace.timeout(1).value, seconds(1));
  EXPECT_TRUE(pace.timeout(0).learned) << "the survivors keep the group's figure";
}

TEST(HangPace, TheTimeTheWorkersWereStoppedIsNoGap) {
  FakeClock clock;
  HangPace pace(params());
  beat(pace, clock, 0, 100, 30, milliseconds(100));
  pace.skip_current_gaps();
  beat(pace, clock, 0, 100, 1, seconds(60));  // SIGTSTP ... SIGCONT
  beat(pace, clock, 0, 100, 3, milliseconds(100));
  EXPECT_EQ(pace.timeout(0).longest_gap, milliseconds(100));
  EXPECT_EQ(pace.timeout(0).value, seconds(1));
}

// After a rank was replaced the survivors' first steps wait for the replacement's first ones:
// not learned, while the survivors keep the learned timeout.
TEST(HangPace, TheFirstGapsAfterAReplacementAreNotLearned) {
  FakeClock clock;
  HangPace pace(params());
  beat(pace, clock, 0, 100, 30, milliseconds(100));
  pace.skip_current_gaps();
  beat(pace, clock, 0, 100, 1, milliseconds(100));
  EXPECT_EQ(pace.timeout(0).value, seconds(1)) << "still learned";
  beat(pace, clock, 0, 100, 3, milliseconds(450));
  EXPECT_EQ(pace.timeout(0).longest_gap, milliseconds(100));
  beat(pace, clock, 0, 100, 1, milliseconds(450));
  EXPECT_EQ(pace.timeout(0).longest_gap, milliseconds(450));
}

// The agent's loop was busy for 600 ms: its next check sees a gap that spans the beats it missed.
TEST(HangPace, AGapSeenByALateCheckIsNotLearned) {
  FakeClock clock;
  HangPace pace(params());
  beat(pace, clock, 0, 100, 30, milliseconds(100));
  const TimePoint checked = clock.now();
  pace.observe(0, 100, checked + milliseconds(700), checked + milliseconds(700));
  EXPECT_EQ(pace.timeout(0).longest_gap, milliseconds(100));
  EXPECT_EQ(pace.timeout(0).group_gaps, 30);
}

}  // namespace
}  // namespace dlaunch
