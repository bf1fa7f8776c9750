// Real dlaunch agents with --rdzv_backend etcd against a real etcd 3.4 (label cluster): the
// workers' contract across agents, node loss (an agent SIGKILLed, its lease expires, the
// others re-form and restart their workers with the smaller world), also during an etcd
// outage, a 3-member etcd cluster losing members under the agents, and `dlaunch status|
// restart|stop` finding the agents through etcd.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "etcd_test_env.h"
#include "private_etcd.h"
#include "tests/support/subprocess.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;
using testing::count_of;
using testing::Subprocess;

class EtcdDlaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto where = test::find_test_etcd();
    if (where.endpoint.empty()) GTEST_SKIP() << where.skip_reason;
    endpoint_ = where.endpoint;
    run_id_ = "dl-" + std::to_string(::getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  static constexpr const char* kFastConf =
      "last_call_timeout=0.5,keep_alive_interval=0.5,keep_alive_max_attempt=4,join_timeout=60";

  // One agent on its own loopback address (as its own "host"), TTL 2 s.
  std::unique_ptr<Subprocess> agent(int host, const std::string& nnodes, int nproc,
                                    const std::vector<std::string>& worker,
                                    const std::vector<std::string>& flags = {},
                                    const std::string& conf = kFastConf) {
    std::vector<std::string> argv = {
        DLAUNCH_BIN,
        "--nnodes",
        nnodes,
        "--nproc_per_node",
        std::to_string(nproc),
        "--rdzv_backend",
        "etcd",
        "--rdzv_endpoint",
        endpoint_,
        "--rdzv_id",
        run_id_,
        "--rdzv_conf",
        conf,
        "--local_addr",
        "127.0.0." + std::to_string(10 + host),
        "--no_python",
        "--no_slurm"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), worker.begin(), worker.end());
    return std::make_unique<Subprocess>(argv);
  }

  // The fixture's etcd; a test with an etcd of its own (private_etcd.h) points it there.
  std::string endpoint_;
  std::string run_id_;
};

bool all_say(const std::vector<std::unique_ptr<Subprocess>>& agents, const std::string& what) {
  for (auto& p : agents) {
    if (p->err().find(what) == std::string::npos) return false;
  }
  return true;
}

TEST_F(EtcdDlaunchTest, TwoAgentsGiveEveryWorkerTheSameWorldAndAgentStore) {
  auto a = agent(1, "2:3", 2, {TEST_WORKER_BIN, "print-env"});
  auto b = agent(2, "2:3", 2, {TEST_WORKER_BIN, "print-env"});
  auto ea = a->wait(120s), eb = b->wait(120s);
  ASSERT_TRUE(ea && eb) << a->err() << b->err();
  EXPECT_EQ(ea->code, 0) << a->out() << a->err();
  EXPECT_EQ(eb->code, 0) << b->out() << b->err();
  const std::string out = a->out() + b->out();
  std::set<std::string> ranks, masters;
  std::regex rank_re(R"(\]:RANK=(\d+))"), master_re(R"(\]:MASTER_ADDR=(\S+))");
  for (std::sregex_iterator it(out.begin(), out.end(), rank_re), end; it != end; ++it) {
    ranks.insert((*it)[1]);
  }
  for (std::sregex_iterator it(out.begin(), out.end(), master_re), end; it != end; ++it) {
    masters.insert((*it)[1]);
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1", "2", "3"})) << out;
  EXPECT_EQ(testing::lines_with_prefix(out, "[default0]:WORLD_SIZE=4").size() +
                testing::lines_with_prefix(out, "[default1]:WORLD_SIZE=4").size(),
            4u)
      << out;
  // One workers' store, on the group-rank-0 agent's address.
  ASSERT_EQ(masters.size(), 1u) << out;
  EXPECT_TRUE(*masters.begin() == "127.0.0.11" || *masters.begin() == "127.0.0.12") << out;
  EXPECT_EQ(testing::lines_with_prefix(out, "[default0]:TORCHELASTIC_USE_AGENT_STORE=True").size(),
            2u)
      << out;
}

TEST_F(EtcdDlaunchTest, KilledAgentIsReplacedByARoundOfTheSurvivors) {
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (int h = 1; h <= 3; ++h) agents.push_back(agent(h, "2:3", 1, {TEST_WORKER_BIN, "sleep"}));
  auto started = [&](Subprocess& p, const std::string& what) {
    return p.err().find(what) != std::string::npos;
  };
  ASSERT_TRUE(testing::wait_until(
      [&] {
        for (auto& p : agents) {
          if (!started(*p, "attempt 0: starting 1 worker(s)")) return false;
        }
        return true;
      },
      60s))
      << agents[0]->err() << agents[1]->err() << agents[2]->err();
  for (auto& p : agents) EXPECT_TRUE(started(*p, " of 3 (node ")) << p->err();
  agents[2]->signal(SIGKILL);
  agents[2]->wait(10s);
  // The survivors notice the expired lease, re-form without spending the restart budget, and
  // start their workers again in a world of 2.
  ASSERT_TRUE(testing::wait_until(
      [&] { return started(*agents[0], "of 2 (node ") && started(*agents[1], "of 2 (node "); },
      60s))
      << agents[0]->err() << agents[1]->err();
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(agents[i]->err().find(") lost (no keep-alive for"), std::string::npos)
        << agents[i]->err();
    EXPECT_NE(agents[i]->err().find("restart count 0/0"), std::string::npos) << agents[i]->err();
    agents[i]->signal(SIGTERM);
  }
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(agents[i]->wait(30s).has_value());
}

// Waits until the workers of the three agents (fail-when-peer-dies, ready=`ready`) run.
void expect_three_ready(const testing::TempDir& ready,
                        const std::vector<std::unique_ptr<Subprocess>>& agents) {
  ASSERT_TRUE(testing::wait_until(
      [&] {
        for (int r = 0; r < 3; ++r) {
          if (!testing::file_exists(ready.file("ready." + std::to_string(r)))) return false;
        }
        return true;
      },
      60s))
      << agents[0]->err() << agents[1]->err() << agents[2]->err();
}

// The first two agents re-formed without the third (127.0.0.13) and without spending the
// restart budget, and finished.
void expect_two_finished_without_a_restart(const std::vector<std::unique_ptr<Subprocess>>& agents,
                                           std::chrono::seconds wait) {
  for (int i = 0; i < 2; ++i) {
    auto e = agents[i]->wait(wait);
    ASSERT_TRUE(e) << agents[i]->err();
    EXPECT_EQ(e->shell_code(), 0) << agents[i]->err();
    EXPECT_NE(agents[i]->out().find("world=2 attempt=1 restart_count=0"), std::string::npos)
        << agents[i]->out() << agents[i]->err();
    EXPECT_NE(agents[i]->err().find("node 127.0.0.13 (node rank "), std::string::npos)
        << agents[i]->err();
  }
}

// As above, but the survivors' workers fail first (as gloo's do when a peer is gone) and the
// budget is 0: the failure waits for the lease verdict, is free, and the job finishes.
TEST_F(EtcdDlaunchTest, KilledAgentWhosePeersFailDoesNotSpendTheRestartBudget) {
  testing::TempDir ready;
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (int h = 1; h <= 3; ++h) {
    agents.push_back(agent(h, "1:3", 1,
                           {TEST_WORKER_BIN, "fail-when-peer-dies", "ready=" + ready.path()}));
  }
  expect_three_ready(ready, agents);
  for (auto& p : agents) ASSERT_NE(p->err().find(" of 3 (node "), std::string::npos) << p->err();
  agents[2]->signal(SIGKILL);
  agents[2]->wait(10s);
  expect_two_finished_without_a_restart(agents, 60s);
}

// A pod deletion (SIGTERM to one agent, --nnodes 2:4, budget 0): the terminated agent's local
// rank 0 dies of the forwarded SIGTERM at once and its local rank 1 takes 3 s (a checkpoint),
// so the others' workers fail while it still runs. It leaves, it did not fail: the others
// re-form free, it exits 143 without a report.
TEST_F(EtcdDlaunchTest, SigtermedAgentLeavesWithoutSpendingTheRestartBudget) {
  testing::TempDir ready;
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (int h = 1; h <= 3; ++h) {
    agents.push_back(agent(
        h, "2:4", 2,
        {TEST_WORKER_BIN, "fail-when-peer-dies", "ready=" + ready.path(), "slow_stop=3"},
        {"--max_restarts", "0"}));
  }
  ASSERT_TRUE(testing::wait_ready(ready, 6, 60s))
      << agents[0]->err() << agents[1]->err() << agents[2]->err();
  ASSERT_TRUE(all_say(agents, " of 6 (node ")) << agents[0]->err();
  agents[2]->signal(SIGTERM);
  auto end = agents[2]->wait(30s);
  ASSERT_TRUE(end) << agents[2]->err();
  EXPECT_EQ(end->shell_code(), 128 + SIGTERM) << agents[2]->err();
  EXPECT_EQ(agents[2]->err().find("job FAILED"), std::string::npos) << agents[2]->err();
  for (int i = 0; i < 2; ++i) {
    auto e = agents[i]->wait(60s);
    ASSERT_TRUE(e) << agents[i]->err();
    EXPECT_EQ(e->shell_code(), 0) << agents[i]->err();
    EXPECT_NE(agents[i]->out().find("world=4 attempt=1 restart_count=0"), std::string::npos)
        << agents[i]->out() << agents[i]->err();
    EXPECT_NE(agents[i]->err().find("node 127.0.0.13 (node rank "), std::string::npos)
        << agents[i]->err();
    EXPECT_NE(agents[i]->err().find(") left"), std::string::npos) << agents[i]->err();
  }
}

// A node SIGKILLed while etcd is down, etcd back long after the failure's usual verdict budget
// (window + 2 keep-alive intervals = 3 s here): the survivors' workers failed at once (their
// peer is gone), but nobody could tell whether a node was lost until etcd answered again. The
// failure waits for the lease verdict from then, so the job re-forms without spending
// --max_restarts 0.
TEST_F(EtcdDlaunchTest, NodeLostDuringAnEtcdOutageDoesNotSpendTheRestartBudget) {
  test::PrivateEtcd etcd(1);
  ASSERT_TRUE(etcd.ok()) << etcd.start_log();
  endpoint_ = etcd.endpoints();
  testing::TempDir ready;
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (int h = 1; h <= 3; ++h) {
    agents.push_back(agent(h, "1:3", 1,
                           {TEST_WORKER_BIN, "fail-when-peer-dies", "ready=" + ready.path()},
                           {"--max_restarts", "0"}));
  }
  expect_three_ready(ready, agents);
  ASSERT_TRUE(all_say(agents, " of 3 (node ")) << agents[0]->err();
  etcd.kill_member(1);
  std::this_thread::sleep_for(1s);
  agents[2]->signal(SIGKILL);
  agents[2]->wait(10s);
  std::this_thread::sleep_for(8s);
  ASSERT_TRUE(etcd.restart_member(1));
  expect_two_finished_without_a_restart(agents, 90s);
}

// --rdzv_endpoint lists the members of a 3-member etcd cluster (etcdctl's form). Losing the
// member of the first endpoint, and later the leader, costs the running job nothing: the agents
// renew their leases through the other members, so nobody is declared lost and the round
// stands. And etcd still serves the rendezvous afterwards: an agent lost then is noticed and
// the others re-form.
TEST_F(EtcdDlaunchTest, AgentsOnAThreeMemberClusterOutliveTheFirstEndpointAndTheLeader) {
  test::PrivateEtcd cluster(3);
  ASSERT_TRUE(cluster.ok()) << cluster.start_log();
  endpoint_ = cluster.endpoints();
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (int h = 1; h <= 3; ++h) agents.push_back(agent(h, "2:3", 1, {TEST_WORKER_BIN, "sleep"}));
  ASSERT_TRUE(
      testing::wait_until([&] { return all_say(agents, "attempt 0: starting 1 worker(s)"); }, 60s))
      << agents[0]->err() << agents[1]->err() << agents[2]->err();
  ASSERT_TRUE(all_say(agents, " of 3 (node ")) << agents[0]->err();
  cluster.kill_member(1);
  std::this_thread::sleep_for(4s);  // two lease TTLs
  ASSERT_TRUE(cluster.restart_member(1));
  std::optional<int> leader;
  ASSERT_TRUE(testing::wait_until([&] { return (leader = cluster.leader()).has_value(); }, 30s));
  cluster.kill_member(*leader);
  std::this_thread::sleep_for(4s);
  for (auto& p : agents) {
    EXPECT_EQ(p->err().find("membership changed"), std::string::npos) << p->err();
    EXPECT_EQ(p->err().find("attempt 1"), std::string::npos) << p->err();
  }
  agents[2]->signal(SIGKILL);
  agents[2]->wait(10s);
  ASSERT_TRUE(testing::wait_until(
      [&] {
        return agents[0]->err().find("of 2 (node ") != std::string::npos &&
               agents[1]->err().find("of 2 (node ") != std::string::npos;
      },
      60s))
      << agents[0]->err() << agents[1]->err();
  for (int i = 0; i < 2; ++i) agents[i]->signal(SIGTERM);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(agents[i]->wait(30s).has_value());
}

// Issue 13: `dlaunch status|restart|stop --rdzv_backend etcd` read the agents' status endpoints
// from etcd (where the etcd rendezvous keeps the job's store) and steer the whole job.
TEST_F(EtcdDlaunchTest, StatusRestartAndStopFindTheAgentsThroughEtcd) {
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (int h = 1; h <= 2; ++h) {
    agents.push_back(agent(h, "2", 2, {TEST_WORKER_BIN, "sleep"}, {"--max_restarts", "1"}));
  }
  const std::vector<std::string> where = {"--rdzv_backend", "etcd", "--rdzv_endpoint", endpoint_,
                                          "--rdzv_id", run_id_};
  auto control = [&](const std::string& command, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {DLAUNCH_BIN, command};
    argv.insert(argv.end(), where.begin(), where.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    return testing::run(argv);
  };
  // Every agent's /status, once both published their endpoints and run their workers at
  // `attempt`.
  auto status_of_both = [&](int attempt, nlohmann::json& j) {
    testing::RunResult r = control("status", {"--json"});
    if (r.exit.shell_code() != 0) return false;
    j = nlohmann::json::parse(r.out);
    if (j["agents"].size() != 2) return false;
    for (const auto& a : j["agents"]) {
      if (a["attempt"] != attempt || a["workers"].size() != 2) return false;
      for (const auto& w : a["workers"]) {
        if (w["state"] != "running") return false;
      }
    }
    return true;
  };
  nlohmann::json j;
  ASSERT_TRUE(testing::wait_until([&] { return status_of_both(0, j); }, 60s))
      << j.dump() << agents[0]->err() << agents[1]->err();
  std::set<int64_t> ranks;
  std::set<std::string> addresses;
  for (const auto& a : j["agents"]) {
    addresses.insert(a["address"].get<std::string>());
    for (const auto& w : a["workers"]) ranks.insert(w["rank"].get<int64_t>());
  }
  EXPECT_EQ(ranks, (std::set<int64_t>{0, 1, 2, 3})) << j.dump();
  EXPECT_EQ(addresses.size(), 2u) << j.dump();
  // The agents print the command that finds them.
  EXPECT_NE(agents[0]->err().find("dlaunch status --rdzv_backend etcd --rdzv_endpoint " +
                                  endpoint_ + " --rdzv_id " + run_id_),
            std::string::npos)
      << agents[0]->err();
  testing::RunResult table = control("status");
  EXPECT_EQ(table.exit.shell_code(), 0) << table.err;
  EXPECT_NE(table.out.find("2 agent(s)"), std::string::npos) << table.out;

  testing::RunResult restart = control("restart");
  EXPECT_EQ(restart.exit.shell_code(), 0) << restart.out << restart.err;
  EXPECT_TRUE(testing::wait_until([&] { return status_of_both(1, j); }, 60s))
      << "every node restarts: " << j.dump();

  testing::RunResult stop = control("stop");
  EXPECT_EQ(stop.exit.shell_code(), 0) << stop.out << stop.err;
  for (auto& a : agents) {
    auto e = a->wait(60s);
    ASSERT_TRUE(e) << a->err();
    EXPECT_EQ(e->shell_code(), 143) << a->err();
  }
  // A run id nobody used: said so, exit 2.
  testing::RunResult none = testing::run({DLAUNCH_BIN, "status", "--rdzv_backend", "etcd",
                                          "--rdzv_endpoint", endpoint_, "--rdzv_id",
                                          run_id_ + "-nobody"});
  EXPECT_EQ(none.exit.shell_code(), 2) << none.err;
  EXPECT_NE(none.err.find("no agent of job"), std::string::npos) << none.err;
}

// Issue 14: the whole job SIGTERMed (every agent leaves cleanly, revoking its lease) and started
// again at once with the same run id. The new agents find the old round complete and wait for
// its nodes to open the next one; nobody will, since they all left: the new agents must notice
// that and form a round within a few keep-alive intervals, not wait for the join timeout.
TEST_F(EtcdDlaunchTest, JobStoppedAndStartedAgainWithTheSameRunIdFormsANewRound) {
  auto all_started = [](const std::vector<std::unique_ptr<Subprocess>>& agents) {
    for (auto& p : agents) {
      if (p->err().find("starting 1 worker(s)") == std::string::npos) return false;
    }
    return true;
  };
  std::vector<std::unique_ptr<Subprocess>> first;
  for (int h = 1; h <= 2; ++h) first.push_back(agent(h, "2", 1, {TEST_WORKER_BIN, "sleep"}));
  ASSERT_TRUE(testing::wait_until([&] { return all_started(first); }, 60s))
      << first[0]->err() << first[1]->err();
  for (auto& p : first) p->signal(SIGTERM);
  for (auto& p : first) ASSERT_TRUE(p->wait(30s).has_value()) << p->err();
  // A join timeout far beyond the wait below: a restart that only forms at the join timeout
  // fails this test.
  const std::string patient =
      "last_call_timeout=0.5,keep_alive_interval=0.5,keep_alive_max_attempt=4,join_timeout=600";
  std::vector<std::unique_ptr<Subprocess>> second;
  for (int h = 1; h <= 2; ++h) {
    second.push_back(agent(h, "2", 1, {TEST_WORKER_BIN, "sleep"}, {}, patient));
  }
  // TTL 2 s + a keep-alive interval + last call, and much slack for a loaded machine.
  ASSERT_TRUE(testing::wait_until([&] { return all_started(second); }, 45s))
      << second[0]->err() << second[1]->err();
  for (auto& p : second) {
    EXPECT_NE(p->err().find(" of 2 (node "), std::string::npos) << p->err();
    p->signal(SIGTERM);
  }
  for (auto& p : second) EXPECT_TRUE(p->wait(30s).has_value());
}

// An etcd outage of a few seconds under running agents: each says so once, not once or twice
// per second, and once more when etcd is back; the job goes on.
TEST_F(EtcdDlaunchTest, EtcdOutageIsLoggedOnceAndItsEndToo) {
  char dir_template[] = "/tmp/dlaunch-etcd-outage-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string scripts = DLAUNCH_CLUSTER_SCRIPTS;
  ASSERT_EQ(std::system((scripts + "/start_etcd.sh " + dir + " >/dev/null 2>&1").c_str()), 0);
  std::string endpoint, pid;
  std::ifstream(dir + "/endpoint") >> endpoint;
  std::ifstream(dir + "/etcd.pid") >> pid;
  // The daemon's own command line, to start it again on the same ports and data.
  std::ifstream cmdline_file("/proc/" + pid + "/cmdline");
  std::string raw((std::istreambuf_iterator<char>(cmdline_file)), std::istreambuf_iterator<char>());
  std::string command;
  for (char ch : raw) command += ch == '\0' ? ' ' : ch;
  ASSERT_FALSE(command.empty());
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (int host = 1; host <= 2; ++host) {
    agents.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        DLAUNCH_BIN, "--nnodes", "2", "--rdzv_backend", "etcd", "--rdzv_endpoint", endpoint,
        "--rdzv_id", run_id_, "--rdzv_conf",
        "last_call_timeout=0.5,keep_alive_interval=0.5,keep_alive_max_attempt=30,join_timeout=60",
        "--local_addr", "127.0.0." + std::to_string(10 + host), "--no_python", "--no_slurm",
        TEST_WORKER_BIN, "sleep", "seconds=10"}));
  }
  ASSERT_TRUE(testing::wait_until(
      [&] {
        return agents[0]->err().find("attempt 0: starting") != std::string::npos &&
               agents[1]->err().find("attempt 0: starting") != std::string::npos;
      },
      60s));
  ASSERT_EQ(std::system(("kill -9 " + pid).c_str()), 0);
  std::this_thread::sleep_for(4s);  // 8 keep-alive intervals without etcd
  ASSERT_EQ(std::system(("cd " + dir + " && (setsid " + command +
                         " </dev/null >/dev/null 2>&1 & echo $! > " + dir + "/etcd.pid)")
                            .c_str()),
            0);
  for (auto& a : agents) {
    auto e = a->wait(60s);
    ASSERT_TRUE(e) << a->err();
    EXPECT_EQ(e->shell_code(), 0) << a->err();
    std::string err = a->err();
    EXPECT_LE(count_of(err, "retrying"), 3u) << err;
    EXPECT_EQ(count_of(err, "reachable again"), 1u) << err;
  }
  std::system((scripts + "/stop_etcd.sh " + dir + " >/dev/null 2>&1").c_str());
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace dlaunch
