// Real dlaunch agents on 127.0.0.1 meeting a store that is not theirs: another run's, or a
// token-protected one without the token. Each must train in its own run or be refused at once
// with one sentence (exit 2); workers of two runs must never share keys.
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN;
const std::string kWorker = TEST_WORKER_BIN;

std::string refusal(const std::string& store_run, const std::string& my_run) {
  return "serves run '" + store_run + "'; this agent's run is '" + my_run + "'";
}

// Four agents, runs X X Y Y, one endpoint, started together, several times. Whichever agent
// binds the endpoint hosts the store for its run; the other run's agents are refused at once.
// The workers connect a few seconds after their round (by then both runs would have formed a
// round on a shared store) and count each other through the store: a worker of the other run
// would show as a member too many or a foreign run id.
TEST(DlaunchSharedEndpoint, TwoRunsStartedTogetherNeverMixTheirWorkers) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
    const std::vector<std::string> runs = {"runx", "runx", "runy", "runy"};
    std::vector<std::unique_ptr<Subprocess>> agents;
    for (const auto& run : runs) {
      agents.push_back(std::make_unique<Subprocess>(
          std::vector<std::string>{kDlaunch, "--nnodes", "2:2", "--rdzv_backend", "c10d",
                                   "--rdzv_endpoint", endpoint, "--rdzv_id", run, "--rdzv_conf",
                                   "join_timeout=60", kWorker, "store-members", "delay=3"}));
    }
    std::map<std::string, int> trained, refused;
    for (size_t i = 0; i < agents.size(); ++i) {
      const std::string& run = runs[i];
      const std::string other = run == "runx" ? "runy" : "runx";
      auto e = agents[i]->wait(120s);
      ASSERT_TRUE(e) << agents[i]->err();
      if (e->shell_code() == 2) {
        EXPECT_EQ(count_of(agents[i]->err(), refusal(other, run)), 1u) << agents[i]->err();
        EXPECT_NE(agents[i]->err().find("give this job its own --rdzv_endpoint"), std::string::npos)
            << agents[i]->err();
        EXPECT_EQ(agents[i]->out().find("members"), std::string::npos) << agents[i]->out();
        ++refused[run];
        continue;
      }
      EXPECT_EQ(e->shell_code(), 0) << agents[i]->out() << agents[i]->err();
      EXPECT_NE(agents[i]->out().find("members run=" + run + " world=2 arrived=2 runs=" + run +
                                      "," + run),
                std::string::npos)
          << agents[i]->out() << agents[i]->err();
      ++trained[run];
    }
    // One run trained with both its agents, the other was refused with both of its.
    ASSERT_EQ(trained.size(), 1u);
    ASSERT_EQ(refused.size(), 1u);
    EXPECT_EQ(trained.begin()->second, 2);
    EXPECT_EQ(refused.begin()->second, 2);
    EXPECT_NE(trained.begin()->first, refused.begin()->first);
  }
}

// A second job on an endpoint whose store a running job hosts: refused at once, not riding on
// the first job's store until that job ends (which then ended the second with "the agent
// hosting the store died").
TEST(DlaunchSharedEndpoint, ASecondJobOnABusyEndpointIsRefusedAtOnce) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  TempDir ready;
  std::vector<std::unique_ptr<Subprocess>> first;
  for (int i = 0; i < 2; ++i) {
    first.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        kDlaunch, "--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
        "--rdzv_id", "first", kWorker, "sleep", "seconds=10", "ready=" + ready.path()}));
  }
  ASSERT_TRUE(wait_ready(ready, 2, 60s)) << first[0]->err() << first[1]->err();
  Subprocess second({kDlaunch, "--nnodes", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                     endpoint, "--rdzv_id", "second", kWorker, "ok"});
  auto e = second.wait(30s);  // the first job runs 10 s more
  ASSERT_TRUE(e) << "the second job was not refused:\n" << second.err();
  EXPECT_EQ(e->shell_code(), 2) << second.out() << second.err();
  EXPECT_EQ(count_of(second.err(), refusal("first", "second")), 1u) << second.err();
  EXPECT_EQ(second.out().find("ok rank"), std::string::npos) << second.out();
  for (auto& agent : first) {
    auto f = agent->wait(60s);
    ASSERT_TRUE(f) << agent->err();
    EXPECT_EQ(f->shell_code(), 0) << agent->err();
  }
}

// An agent without the job token, on the host of the job's agents (where PyTorch's workers are
// let in without it): refused at once with one sentence, never admitted into the job, and the
// store host logs the refusal once.
TEST(DlaunchSharedEndpoint, AnAgentWithoutTheJobTokenIsRefusedAtOnce) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  const std::map<std::string, std::string> token = {{"DLAUNCH_JOB_TOKEN", "s3cret"}};
  TempDir ready;
  std::vector<std::unique_ptr<Subprocess>> job;
  for (int i = 0; i < 2; ++i) {
    job.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{kDlaunch, "--nnodes", "2:3", "--rdzv_backend", "c10d",
                                 "--rdzv_endpoint", endpoint, "--rdzv_id", "guarded", "--rdzv_conf",
                                 "last_call_timeout=0.5", kWorker, "sleep", "seconds=8",
                                 "ready=" + ready.path()},
        token));
  }
  ASSERT_TRUE(wait_ready(ready, 2, 60s)) << job[0]->err() << job[1]->err();
  Subprocess stranger({kDlaunch, "--nnodes", "2:3", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                       endpoint, "--rdzv_id", "guarded", kWorker, "print-env"});
  auto e = stranger.wait(30s);
  ASSERT_TRUE(e) << "the tokenless agent was not refused:\n" << stranger.err();
  EXPECT_EQ(e->shell_code(), 2) << stranger.out() << stranger.err();
  EXPECT_EQ(count_of(stranger.err(), "this job requires a job token (DLAUNCH_JOB_TOKEN)"), 1u)
      << stranger.err();
  EXPECT_EQ(stranger.out().find("WORLD_SIZE"), std::string::npos) << stranger.out();
  std::string job_err;
  for (auto& agent : job) {
    auto f = agent->wait(60s);
    ASSERT_TRUE(f) << agent->err();
    EXPECT_EQ(f->shell_code(), 0) << agent->err();
    job_err += agent->err();
  }
  EXPECT_EQ(count_of(job_err, "refused agent"), 1u) << job_err;
  EXPECT_EQ(job_err.find("not counted as a restart"), std::string::npos) << job_err;  // no re-form
}

}  // namespace
}  // namespace dlaunch::testing
