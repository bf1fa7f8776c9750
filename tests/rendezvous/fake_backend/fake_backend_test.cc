// A rendezvous backend added from outside dlaunch's tree (fake_backend.h: this folder plus one
// registration line) runs a real job: dlaunch checks its flags through the descriptor, creates
// its handler, and starts the workers with what its round returned.
#include <gtest/gtest.h>

#include <string>

#include "tests/rendezvous/fake_backend/fake_backend.h"
#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

const std::string kFakeDlaunch = FAKE_DLAUNCH_BIN;
const std::string kDlaunch = DLAUNCH_BIN;

// The worker's environment variable `name` as it wrote it into `env_dump` (env's output).
std::string env_value(const std::string& env_dump, const std::string& name) {
  auto lines = lines_with_prefix(env_dump, name + "=");
  return lines.empty() ? "<unset>" : lines.front().substr(name.size() + 1);
}

TEST(FakeRendezvousBackend, RunsTwoWorkersWithTheEnvironmentItsRoundGave) {
  TempDir dir;
  // No port in the endpoint: the workers' MASTER_PORT is the fake backend's default port.
  RunResult r = run({kFakeDlaunch, "--rdzv_backend", "fake", "--rdzv_endpoint", "127.0.0.2",
                     "--rdzv_id", "fakejob", "--rdzv_conf", "fake_only_key=1",
                     "--nproc_per_node", "2", "--no_python", "/bin/sh", "-c",
                     "env > \"$0/env.$LOCAL_RANK\"", dir.path()},
                    {}, std::chrono::seconds(120));
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  for (int rank : {0, 1}) {
    SCOPED_TRACE(rank);
    const std::string env = read_file(dir.file("env." + std::to_string(rank)));
    EXPECT_EQ(env_value(env, "MASTER_ADDR"), "127.0.0.2");
    EXPECT_EQ(env_value(env, "MASTER_PORT"), std::to_string(kFakeDefaultPort));
    EXPECT_EQ(env_value(env, "WORLD_SIZE"), "2");
    EXPECT_EQ(env_value(env, "RANK"), std::to_string(rank));
    EXPECT_EQ(env_value(env, "LOCAL_RANK"), std::to_string(rank));
    EXPECT_EQ(env_value(env, "GROUP_RANK"), "0");
    EXPECT_EQ(env_value(env, "TORCHELASTIC_RUN_ID"), "fakejob");
  }
}

TEST(FakeRendezvousBackend, ItsOwnFlagCheckRefusesAMissingEndpoint) {
  RunResult r = run({kFakeDlaunch, "--rdzv_backend", "fake", "--no_python", "/bin/true"});
  EXPECT_EQ(r.exit.shell_code(), 2);
  EXPECT_NE(r.err.find("--rdzv_backend fake needs --rdzv_endpoint HOST[:PORT]"),
            std::string::npos)
      << r.err;
}

TEST(FakeRendezvousBackend, IsListedAmongTheBackendsOnlyWhereRegistered) {
  RunResult with = run({kFakeDlaunch, "--rdzv_backend", "nope", "--no_python", "/bin/true"});
  EXPECT_EQ(with.exit.shell_code(), 2);
  EXPECT_NE(with.err.find("expected static, c10d, etcd or fake"), std::string::npos) << with.err;
  RunResult without = run({kDlaunch, "--rdzv_backend", "fake", "--rdzv_endpoint", "127.0.0.2",
                           "--no_python", "/bin/true"});
  EXPECT_EQ(without.exit.shell_code(), 2);
  EXPECT_NE(without.err.find("--rdzv_backend='fake' is not allowed; expected static, c10d or etcd"),
            std::string::npos)
      << without.err;
}

}  // namespace
}  // namespace dlaunch::testing
