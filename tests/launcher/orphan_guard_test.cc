// The orphan guard as a real process: stop() ends it promptly, also when the guard cannot run.
#include "launcher/process/orphan_guard.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

TEST(OrphanGuard, StopEndsTheGuardAtOnce) {
  OrphanGuard guard;
  pid_t pid = guard.pid();
  ASSERT_GT(pid, 0);
  auto t0 = std::chrono::steady_clock::now();
  guard.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms);
  EXPECT_FALSE(alive(pid)) << "reaped by stop()";
}

// A stray SIGSTOP (a chaos soak sent one) left the guard unable to read its 'q': stop() waited
// forever and the agent never exited. Now it gives the guard a second, then SIGKILLs it.
TEST(OrphanGuard, StopDoesNotWaitForeverOnAStoppedGuard) {
  OrphanGuard guard;
  pid_t pid = guard.pid();
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  auto t0 = std::chrono::steady_clock::now();
  guard.stop();
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 900ms) << "the guard gets its second first";
  EXPECT_LT(took, 10s);
  EXPECT_FALSE(alive(pid));
}

}  // namespace
}  // namespace dlaunch
