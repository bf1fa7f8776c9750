// The etcd rendezvous backend with real processes against a real etcd 3.4 (label cluster):
// several etcd_rdzv_agent processes (the registry's "etcd" handler, no workers) form rounds,
// honour MIN:MAX and last call, re-form when one is SIGKILLed (its lease expires), and admit a
// late node at the next round.
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>
#include <regex>
#include <set>

#include "etcd_test_env.h"
#include "tests/support/subprocess.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;
using testing::Subprocess;

struct Round {
  int64_t round = -1, rank = -1, size = -1;
  std::string master;
};

// The last "round ..." line of an agent's output, if any.
std::optional<Round> last_round(const std::string& out) {
  static const std::regex re(R"(round (\d+) rank (\d+) size (\d+) master (\S+) t=)");
  std::optional<Round> last;
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    last = Round{std::stoll((*it)[1]), std::stoll((*it)[2]), std::stoll((*it)[3]), (*it)[4]};
  }
  return last;
}

class EtcdRendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto where = test::find_test_etcd();
    if (where.endpoint.empty()) GTEST_SKIP() << where.skip_reason;
    endpoint_ = where.endpoint;
    run_id_ = "rdzv-" + std::to_string(::getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  // Fast keep-alive so node loss shows within a few seconds: lease TTL 2 s.
  std::unique_ptr<Subprocess> start_agent(const std::string& nnodes,
                                          const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {DLAUNCH_ETCD_AGENT,
                                     "--endpoint",
                                     endpoint_,
                                     "--run_id",
                                     run_id_,
                                     "--nnodes",
                                     nnodes,
                                     "--conf",
                                     "last_call_timeout=0.5,keep_alive_interval=0.5,"
                                     "keep_alive_max_attempt=4,join_timeout=60",
                                     "--check_store"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Subprocess>(argv);
  }

  // Waits until every agent printed a round >= `round` of `size` nodes.
  bool wait_for_round(const std::vector<Subprocess*>& agents, int64_t round, int64_t size,
                      std::chrono::milliseconds timeout) {
    return testing::wait_until(
        [&] {
          for (auto* a : agents) {
            auto r = last_round(a->out());
            if (!r || r->round < round || r->size != size) return false;
            if (a->out().find("store check/" + std::to_string(r->round)) == std::string::npos) {
              return false;
            }
          }
          return true;
        },
        timeout);
  }

  std::string describe(const std::vector<Subprocess*>& agents) {
    std::string s;
    for (auto* a : agents)
      s += "--- agent " + std::to_string(a->pid()) + ":\n" + a->out() + a->err();
    return s;
  }

  std::string endpoint_;
  std::string run_id_;
};

TEST_F(EtcdRendezvousTest, AgentsFormOneRoundWithDistinctRanksAndOneWorkersStore) {
  auto a = start_agent("2:3"), b = start_agent("2:3"), c = start_agent("2:3");
  std::vector<Subprocess*> all = {a.get(), b.get(), c.get()};
  ASSERT_TRUE(wait_for_round(all, 0, 3, 30s)) << describe(all);
  std::set<int64_t> ranks;
  std::set<std::string> masters;
  for (auto* p : all) {
    auto r = last_round(p->out());
    ranks.insert(r->rank);
    masters.insert(r->master);
    EXPECT_EQ(r->round, 0);
  }
  EXPECT_EQ(ranks, (std::set<int64_t>{0, 1, 2}));
  // One workers' store, hosted by rank 0 and reached by all (--check_store wrote through it).
  EXPECT_EQ(masters.size(), 1u) << describe(all);
  EXPECT_EQ(masters.begin()->rfind("127.0.0.1:", 0), 0u);
}

// Many agents joining at the same moment (the join path without compare-and-swap): one
// round of all of them, ranks 0..N-1 each exactly once, one workers' store.
TEST_F(EtcdRendezvousTest, SixteenAgentsJoiningAtOnceFormOneRoundWithDenseRanks) {
  constexpr int kAgents = 16;
  std::vector<std::unique_ptr<Subprocess>> agents;
  std::vector<Subprocess*> all;
  for (int i = 0; i < kAgents; ++i) {
    agents.push_back(start_agent(std::to_string(kAgents)));
    all.push_back(agents.back().get());
  }
  ASSERT_TRUE(wait_for_round(all, 0, kAgents, 60s)) << describe(all);
  std::set<int64_t> ranks;
  std::set<std::string> masters;
  for (auto* p : all) {
    auto r = last_round(p->out());
    EXPECT_EQ(r->round, 0);
    ranks.insert(r->rank);
    masters.insert(r->master);
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(kAgents));
  EXPECT_EQ(*ranks.begin(), 0);
  EXPECT_EQ(*ranks.rbegin(), kAgents - 1);
  EXPECT_EQ(masters.size(), 1u);
}

TEST_F(EtcdRendezvousTest, LastCallCompletesAtMinNodes) {
  auto a = start_agent("2:4"), b = start_agent("2:4");
  std::vector<Subprocess*> all = {a.get(), b.get()};
  ASSERT_TRUE(wait_for_round(all, 0, 2, 30s)) << describe(all);
}

TEST_F(EtcdRendezvousTest, NodeRankHintsAreHonoured) {
  auto a = start_agent("2", {"--node_rank", "1"}), b = start_agent("2", {"--node_rank", "0"});
  std::vector<Subprocess*> all = {a.get(), b.get()};
  ASSERT_TRUE(wait_for_round(all, 0, 2, 30s)) << describe(all);
  EXPECT_EQ(last_round(a->out())->rank, 1);
  EXPECT_EQ(last_round(b->out())->rank, 0);
}

TEST_F(EtcdRendezvousTest, KilledAgentsLeaseExpiresAndTheOthersReform) {
  auto a = start_agent("2:3"), b = start_agent("2:3"), c = start_agent("2:3");
  std::vector<Subprocess*> all = {a.get(), b.get(), c.get()};
  ASSERT_TRUE(wait_for_round(all, 0, 3, 30s)) << describe(all);
  // Kill the workers' store host too when it is the victim: the survivors must host a new one.
  Subprocess* victim = nullptr;
  for (auto* p : all) {
    if (last_round(p->out())->rank == 0) victim = p;
  }
  ASSERT_NE(victim, nullptr);
  victim->signal(SIGKILL);
  victim->wait(5s);
  std::vector<Subprocess*> survivors;
  for (auto* p : all) {
    if (p != victim) survivors.push_back(p);
  }
  // TTL 2 s + one keep-alive interval + last call; generous for a loaded machine.
  ASSERT_TRUE(wait_for_round(survivors, 1, 2, 60s)) << describe(all);
  std::set<int64_t> ranks;
  for (auto* p : survivors) {
    EXPECT_NE(p->out().find("event membership"), std::string::npos) << p->out();
    EXPECT_NE(p->out().find(") lost (no keep-alive for"), std::string::npos) << p->out();
    ranks.insert(last_round(p->out())->rank);
  }
  EXPECT_EQ(ranks, (std::set<int64_t>{0, 1}));
}

TEST_F(EtcdRendezvousTest, LateAgentIsAdmittedAtTheNextRound) {
  auto a = start_agent("2:3"), b = start_agent("2:3");
  ASSERT_TRUE(wait_for_round({a.get(), b.get()}, 0, 2, 30s)) << describe({a.get(), b.get()});
  auto c = start_agent("2:3");
  std::vector<Subprocess*> all = {a.get(), b.get(), c.get()};
  ASSERT_TRUE(wait_for_round(all, 1, 3, 30s)) << describe(all);
}

TEST_F(EtcdRendezvousTest, UnreachableEtcdFailsNamingTheEndpoint) {
  auto r = testing::run(
      {DLAUNCH_ETCD_AGENT, "--endpoint", "127.0.0.1:1", "--run_id", run_id_, "--nnodes", "1"}, {},
      30s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit.code, 1);
  EXPECT_NE(r.out.find("cannot connect to etcd at 127.0.0.1:1"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dlaunch
