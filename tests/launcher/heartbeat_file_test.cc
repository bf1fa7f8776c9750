#include "launcher/hang/heartbeat_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/heartbeat.h"
#include "launcher/process/worker_group.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

std::string temp_path(const char* name) {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/" + name + "." + std::to_string(::getpid());
}

TEST(HeartbeatFile, AnArmedFileIsNoBeat) {
  std::string path = temp_path("heartbeat_armed");
  ASSERT_TRUE(arm_heartbeat_file(path));
  EXPECT_FALSE(last_heartbeat(path).has_value());
  ::unlink(path.c_str());
  EXPECT_FALSE(last_heartbeat(path).has_value());
}

// The race: the agent records the start, the worker touches the file within the same jiffy, and
// the file's time (the kernel's coarse clock) can be older than the recorded start. The beat must
// still arm the hang rule, in every one of many tries.
TEST(HeartbeatFile, ATouchRightAfterTheStartIsABeat) {
  std::string path = temp_path("heartbeat_race");
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(arm_heartbeat_file(path));
    TimePoint started = std::chrono::steady_clock::now();
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), nullptr, 0), 0);
    auto beat = last_heartbeat(path);
    ASSERT_TRUE(beat.has_value()) << "try " << i;
    TimePoint later = started + 2s;
    EXPECT_TRUE(WorkerGroup::is_hung(started, beat, later, 1s, /*from_start=*/false)) << "try " << i;
    EXPECT_FALSE(WorkerGroup::is_hung(started, beat, started + 500ms, 1s, false)) << "try " << i;
  }
  ::unlink(path.c_str());
}

TEST(HeartbeatFile, ReArmingForgetsAnEarlierBeat) {
  std::string path = temp_path("heartbeat_rearm");
  ASSERT_TRUE(arm_heartbeat_file(path));
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), nullptr, 0), 0);
  ASSERT_TRUE(last_heartbeat(path).has_value());
  ASSERT_TRUE(arm_heartbeat_file(path));
  EXPECT_FALSE(last_heartbeat(path).has_value());
  ::unlink(path.c_str());
}

// The worker's opt-in (common/rank_recovery.h): the whole line, anywhere in the file; a reset
// for a replacement forgets it.
TEST(HeartbeatFile, RankRecoveryIsAnnouncedByItsLine) {
  std::string path = temp_path("heartbeat_announce");
  ASSERT_TRUE(arm_heartbeat_file(path));
  EXPECT_FALSE(announced_rank_recovery(path));
  auto write = [&](const char* text) {
    FILE* f = std::fopen(path.c_str(), "a");
    ASSERT_NE(f, nullptr);
    std::fputs(text, f);
    std::fclose(f);
  };
  write("rank_recovery");  // not a whole line yet
  EXPECT_FALSE(announced_rank_recovery(path));
  write("_x\nsomething else\n");
  EXPECT_FALSE(announced_rank_recovery(path));
  write("rank_recovery\n");
  EXPECT_TRUE(announced_rank_recovery(path));
  // A plain write is a beat (common/rank_recovery.h keeps the file's times: no beat).
  EXPECT_TRUE(last_heartbeat(path).has_value());
  ASSERT_TRUE(arm_heartbeat_file(path));
  EXPECT_FALSE(announced_rank_recovery(path));
  EXPECT_FALSE(last_heartbeat(path).has_value());
  ::unlink(path.c_str());
  EXPECT_FALSE(announced_rank_recovery(path));
}

}  // namespace
}  // namespace dlaunch
