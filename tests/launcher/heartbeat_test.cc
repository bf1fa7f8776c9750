// common/heartbeat.h: the worker side of hang detection. Its own binary: heartbeat() caches
// DLAUNCH_HEARTBEAT_FILE on first use, so the variable must be set before any call.
#include "common/heartbeat.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>
#include <thread>

namespace dlaunch {
namespace {

TEST(Heartbeat, CreatesThenTouchesTheFile) {
  char dir[] = "/tmp/dlaunch_hb_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string path = std::string(dir) + "/heartbeat";
  setenv("DLAUNCH_HEARTBEAT_FILE", path.c_str(), 1);
  heartbeat();
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0) << "the first beat creates the file";
  // Age the file, wait out the rate limit, beat again: the mtime moves forward.
  timespec old[2] = {{1000000000, 0}, {1000000000, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), old, 0), 0);
  std::this_thread::sleep_for(kHeartbeatMinInterval + std::chrono::milliseconds(50));
  heartbeat();
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_GT(st.st_mtim.tv_sec, 1000000000);
  unlink(path.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace dlaunch
