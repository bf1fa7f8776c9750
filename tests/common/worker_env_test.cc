#include "common/worker_env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>

#include "common/error.h"

namespace dlaunch {
namespace {

class WorkerEnvTest : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    for (const char* name :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE",
          "DLAUNCH_HEARTBEAT_FILE", "DLAUNCH_SHUTDOWN_GRACE", "DLAUNCH_REPLACEMENT"}) {
      ::unsetenv(name);
    }
  }
};

TEST_F(WorkerEnvTest, RoundTripsThroughTheEnvironment) {
  WorkerEnv env;
  env.rank = 3;
  env.local_rank = 1;
  env.world_size = 4;
  env.local_world_size = 2;
  env.use_agent_store = true;
  env.heartbeat_file = "/tmp/hb";
  env.shutdown_grace = 2.5;
  std::map<std::string, std::string> vars;
  for (auto& [k, v] : env.to_env()) vars[k] = v;
  EXPECT_EQ(vars["TORCHELASTIC_USE_AGENT_STORE"], "True");
  EXPECT_EQ(vars.count("TORCHELASTIC_ERROR_FILE"), 0u) << "empty optional fields are left out";
  EXPECT_EQ(vars["DLAUNCH_SHUTDOWN_GRACE"], "2.5");
  for (auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  WorkerEnv read = WorkerEnv::from_environ();
  EXPECT_EQ(read.rank, 3);
  EXPECT_EQ(read.local_rank, 1);
  EXPECT_EQ(read.world_size, 4);
  EXPECT_EQ(read.local_world_size, 2);
  EXPECT_TRUE(read.use_agent_store);
  EXPECT_EQ(read.heartbeat_file, "/tmp/hb");
  EXPECT_EQ(read.shutdown_grace, 2.5);
  for (auto& [k, v] : vars) ::unsetenv(k.c_str());
}

TEST_F(WorkerEnvTest, UnlaunchedProcessIsAWorldOfOne) {
  EXPECT_FALSE(WorkerEnv::launched());
  WorkerEnv env = WorkerEnv::from_environ();
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
}

TEST_F(WorkerEnvTest, PartialContractIsRejected) {
  ::setenv("RANK", "0", 1);
  EXPECT_THROW(WorkerEnv::from_environ(), UsageError);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "2", 1);
  EXPECT_THROW(WorkerEnv::from_environ(), UsageError);
}

TEST_F(WorkerEnvTest, ShutdownGraceIsOptionalAndNeverNegative) {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  EXPECT_FALSE(WorkerEnv::from_environ().shutdown_grace.has_value());
  ::setenv("DLAUNCH_SHUTDOWN_GRACE", "-1", 1);
  EXPECT_THROW(WorkerEnv::from_environ(), UsageError);
  ::setenv("DLAUNCH_SHUTDOWN_GRACE", "soon", 1);
  EXPECT_THROW(WorkerEnv::from_environ(), UsageError);
  ::setenv("DLAUNCH_SHUTDOWN_GRACE", "0", 1);
  EXPECT_EQ(WorkerEnv::from_environ().shutdown_grace, 0.0);
}

// Only a replacement of a failed rank carries DLAUNCH_REPLACEMENT=1; everyone else has none.
TEST_F(WorkerEnvTest, ReplacementIsSetOnlyForAReplacedRankAndIsZeroOrOne) {
  WorkerEnv env;
  for (auto& [k, v] : env.to_env()) EXPECT_NE(k, "DLAUNCH_REPLACEMENT");
  env.replacement = true;
  std::map<std::string, std::string> vars;
  for (auto& [k, v] : env.to_env()) vars[k] = v;
  EXPECT_EQ(vars["DLAUNCH_REPLACEMENT"], "1");
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  EXPECT_FALSE(WorkerEnv::from_environ().replacement);
  ::setenv("DLAUNCH_REPLACEMENT", "1", 1);
  EXPECT_TRUE(WorkerEnv::from_environ().replacement);
  ::setenv("DLAUNCH_REPLACEMENT", "0", 1);
  EXPECT_FALSE(WorkerEnv::from_environ().replacement);
  ::setenv("DLAUNCH_REPLACEMENT", "yes", 1);
  EXPECT_THROW(WorkerEnv::from_environ(), UsageError);
}

}  // namespace
}  // namespace dlaunch
