// Rendezvous handlers as threads in one process over a real TcpStoreServer on 127.0.0.1.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "rendezvous/handlers/dynamic_rendezvous_state.h"
#include "rendezvous/tcp/job_token.h"
#include "rendezvous/handlers/rendezvous_events.h"
#include "rendezvous/handlers/rendezvous_registry.h"
#include "rendezvous/tcp/tcp_store_client.h"
#include "rendezvous/tcp/tcp_store_server.h"
#include "rendezvous/tcp/worker_namespace.h"
#include "tests/support/free_port.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

class RendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TcpStoreServer>(TcpStoreServerOptions{});
    port_ = server_->start();
  }
  RendezvousParams params(const std::string& backend, int64_t min, int64_t max,
                          const std::string& host) {
    RendezvousParams p;
    p.backend = backend;
    p.run_id = "job1";
    p.min_nodes = min;
    p.max_nodes = max;
    p.endpoint = "127.0.0.1:" + std::to_string(port_);
    p.host = host;
    p.config = {{"join_timeout", "20"}, {"last_call_timeout", "0.3"}};
    return p;
  }
  std::unique_ptr<TcpStoreServer> server_;
  uint16_t port_ = 0;
};

// Runs next_rendezvous on every handler at once.
std::vector<RendezvousResult> meet(std::vector<std::unique_ptr<RendezvousHandler>>& handlers) {
  std::vector<std::future<RendezvousResult>> futures;
  for (auto& h : handlers) {
    futures.push_back(std::async(std::launch::async, [&h] { return h->next_rendezvous(); }));
  }
  std::vector<RendezvousResult> results;
  for (auto& f : futures) results.push_back(f.get());
  return results;
}

// Who hosts the job's store is the backend factory's decision when the agent asks
// (host_store): c10d, the first agent that binds the endpoint (port 0: a free port, which it
// then joins on); static, node rank 0 only.
TEST_F(RendezvousTest, TheBackendDecidesWhichAgentHostsTheStore) {
  auto first = params("c10d", 2, 2, "a");
  first.endpoint = "127.0.0.1:0";
  first.host_store = true;
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  hs.push_back(create_rendezvous_handler(first));
  auto server = hs[0]->hosted_store();
  ASSERT_NE(server, nullptr);
  auto second = params("c10d", 2, 2, "b");
  second.endpoint = "127.0.0.1:" + std::to_string(server->port());
  second.host_store = true;  // the port is held: this one joins as a client
  hs.push_back(create_rendezvous_handler(second));
  EXPECT_EQ(hs[1]->hosted_store(), nullptr);
  auto rs = meet(hs);
  EXPECT_EQ(rs[0].master_port, server->port());
  EXPECT_EQ(rs[1].master_port, server->port());
  for (auto& h : hs) h->shutdown();

  auto rank1 = params("static", 2, 2, "b");
  rank1.endpoint = "127.0.0.1:" + std::to_string(testing::free_port());
  rank1.node_rank = 1;
  rank1.host_store = true;
  auto rank0 = rank1;
  rank0.node_rank = 0;
  std::vector<std::unique_ptr<RendezvousHandler>> statics;
  statics.push_back(create_rendezvous_handler(rank0));
  statics.push_back(create_rendezvous_handler(rank1));
  ASSERT_NE(statics[0]->hosted_store(), nullptr);
  EXPECT_EQ(statics[1]->hosted_store(), nullptr);
  auto ss = meet(statics);
  EXPECT_EQ(ss[1].group_world_size, 2);
  // Without host_store (the default) no factory starts a server.
  auto plain = params("c10d", 1, 1, "c");
  EXPECT_EQ(create_rendezvous_handler(plain)->hosted_store(), nullptr);
}

TEST_F(RendezvousTest, StaticRanksFollowNodeRankWithUnevenWorkersPerNode) {
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  const int64_t lws[] = {2, 3, 1};
  for (int64_t k : {2, 0, 1}) {  // arrival order differs from node rank
    auto p = params("static", 3, 3, "host-" + std::to_string(k));
    p.node_rank = k;
    p.local_world_size = lws[k];
    hs.push_back(create_rendezvous_handler(p));
  }
  auto rs = meet(hs);
  for (auto& r : rs) {
    EXPECT_EQ(r.group_world_size, 3);
    EXPECT_EQ(r.world_size(), 6);
    EXPECT_EQ(r.local_world_sizes, (std::vector<int64_t>{2, 3, 1}));
    EXPECT_EQ(r.hosts, (std::vector<std::string>{"host-0", "host-1", "host-2"}));
    EXPECT_EQ(r.master_addr, "127.0.0.1");
    EXPECT_EQ(r.master_port, port_);
    EXPECT_EQ(r.restart_count, 0);
  }
  EXPECT_EQ(rs[0].group_rank, 2);
  EXPECT_EQ(rs[0].global_rank_base(), 5);
  EXPECT_EQ(rs[1].global_rank_base(), 0);
  EXPECT_EQ(rs[2].global_rank_base(), 2);
  // The job store is shared and namespaced.
  rs[0].store->set("k", to_bytes("v"));
  EXPECT_EQ(to_string(rs[1].store->get("k")), "v");
}

// Once released, a static node reads nothing more: its WAIT_GET on "all" brought the round's
// table and the restart count with it. Before, each node then sent a GET of each and an ADD:
// three requests per node, from every node of the job at the same moment. The restart count
// still arrives (round 1 after a restart request).
TEST_F(RendezvousTest, StaticNodesReadNothingMoreOnceReleased) {
  constexpr int64_t kNodes = 4;
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  for (int64_t k = 0; k < kNodes; ++k) {
    auto p = params("static", kNodes, kNodes, "host-" + std::to_string(k));
    p.node_rank = k;
    hs.push_back(create_rendezvous_handler(p));
  }
  const int64_t before = server_->stats().requests;
  auto rs = meet(hs);
  const int64_t round0 = server_->stats().requests - before;
  for (const auto& r : rs) EXPECT_EQ(r.restart_count, 0);
  hs[2]->request_restart("rank 5 failed");
  auto again = meet(hs);
  for (const auto& r : again) {
    EXPECT_EQ(r.round, 1);
    EXPECT_EQ(r.restart_count, 1);
    EXPECT_EQ(r.local_world_sizes, std::vector<int64_t>(kNodes, 1));
  }
  // Per node: its record (compare_set), the count (add), one WAIT_GET; the closer also reads
  // the records, writes the table and sets "all" (4 more), and before that begins the workers'
  // namespace (2 more in a first round: CHECK and SET; a node whose 1 s slice ran out before
  // the release adds one request per slice, which this round on one host does not).
  EXPECT_LE(round0, 3 * kNodes + 6) << "requests in a round of " << kNodes << " static nodes";
}

std::string failure_of(std::vector<std::unique_ptr<RendezvousHandler>>& hs) {
  std::vector<std::future<std::string>> fs;
  for (auto& h : hs) {
    fs.push_back(std::async(std::launch::async, [&h]() -> std::string {
      try {
        h->next_rendezvous();
        return "";
      } catch (const Error& e) {
        return e.what();
      }
    }));
  }
  std::string all;
  for (auto& f : fs) all += f.get() + "\n";
  return all;
}

TEST_F(RendezvousTest, StaticTwoAgentsClaimingOneNodeRankFailWithBothHosts) {
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  for (const char* host : {"alpha", "beta"}) {
    auto p = params("static", 2, 2, host);
    p.node_rank = 0;
    p.config["join_timeout"] = "3";
    hs.push_back(create_rendezvous_handler(p));
  }
  auto all = failure_of(hs);
  EXPECT_NE(all.find("node rank 0 is claimed by two agents"), std::string::npos) << all;
  EXPECT_NE(all.find("alpha"), std::string::npos) << all;
  EXPECT_NE(all.find("beta"), std::string::npos) << all;
}

TEST_F(RendezvousTest, StaticDifferentNodeCountsFailNamingHostsAndValues) {
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  auto a = params("static", 2, 2, "alpha");
  a.node_rank = 0;
  auto b = params("static", 3, 3, "beta");
  b.node_rank = 1;
  a.config["join_timeout"] = b.config["join_timeout"] = "10";
  hs.push_back(create_rendezvous_handler(a));
  hs.push_back(create_rendezvous_handler(b));
  auto start = std::chrono::steady_clock::now();
  auto all = failure_of(hs);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);  // before the join timeout
  EXPECT_NE(all.find("--nnodes 2 on alpha"), std::string::npos) << all;
  EXPECT_NE(all.find("--nnodes 3 on beta"), std::string::npos) << all;
}

TEST_F(RendezvousTest, StaticDifferentRunIdsFail) {
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  auto a = params("static", 2, 2, "alpha");
  a.node_rank = 0;
  auto b = params("static", 2, 2, "beta");
  b.node_rank = 1;
  b.run_id = "other-job";
  hs.push_back(create_rendezvous_handler(a));
  hs.push_back(create_rendezvous_handler(b));
  auto all = failure_of(hs);
  EXPECT_NE(all.find("'job1' on alpha"), std::string::npos) << all;
  EXPECT_NE(all.find("'other-job' on beta"), std::string::npos) << all;
}

TEST_F(RendezvousTest, StaticMissingNodeTimesOutNamingIt) {
  auto p = params("static", 2, 2, "alpha");
  p.node_rank = 0;
  p.config["join_timeout"] = "1";
  auto h = create_rendezvous_handler(p);
  try {
    h->next_rendezvous();
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("missing node ranks: 1"), std::string::npos) << e.what();
  }
}

TEST_F(RendezvousTest, StaticMasterNeverAnsweringIsAConnectionErrorWithinTheJoinTimeout) {
  uint16_t dead = port_;
  server_->stop();
  auto p = params("static", 2, 2, "alpha");
  p.endpoint = "127.0.0.1:" + std::to_string(dead);
  p.node_rank = 1;
  p.config["join_timeout"] = "1";
  auto start = std::chrono::steady_clock::now();
  try {
    create_rendezvous_handler(p);
    FAIL() << "expected ConnectionError";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find(p.endpoint), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST_F(RendezvousTest, DynamicCompletesAtMaxWithDistinctRanksAndHonoursHints) {
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  for (int i = 0; i < 3; ++i) {
    auto p = params("c10d", 2, 3, "h" + std::to_string(i));
    p.config["last_call_timeout"] = "30";  // completion must come from MAX, not last call
    if (i == 1) p.node_rank = 0;
    hs.push_back(create_rendezvous_handler(p));
  }
  auto start = std::chrono::steady_clock::now();
  auto rs = meet(hs);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
  std::set<int64_t> ranks;
  for (auto& r : rs) {
    EXPECT_EQ(r.group_world_size, 3);
    EXPECT_EQ(r.round, rs[0].round);
    EXPECT_EQ(r.hosts, rs[0].hosts);
    ranks.insert(r.group_rank);
  }
  EXPECT_EQ(ranks, (std::set<int64_t>{0, 1, 2}));
  EXPECT_EQ(rs[1].group_rank, 0);  // the hint
  EXPECT_EQ(rs[0].hosts[0], "h1");
}

// The store calls of one agent's rendezvous connection, by kind (over an agent's TCP client).
class CallCountingStore final : public Store {
 public:
  explicit CallCountingStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}
  void set(const std::string& k, const Bytes& v) override {
    note("set");
    inner_->set(k, v);
  }
  Bytes get(const std::string& k) override { return note("get"), inner_->get(k); }
  int64_t add(const std::string& k, int64_t d) override { return note("add"), inner_->add(k, d); }
  Bytes compare_set(const std::string& k, const Bytes& e, const Bytes& d) override {
    return note("compare_set"), inner_->compare_set(k, e, d);
  }
  bool check(const std::vector<std::string>& k) override { return note("check"), inner_->check(k); }
  void wait(const std::vector<std::string>& k, Duration t) override {
    note("wait");
    inner_->wait(k, t);
  }
  using Store::wait;
  bool delete_key(const std::string& k) override { return note("delete"), inner_->delete_key(k); }
  int64_t num_keys() override { return note("num_keys"), inner_->num_keys(); }
  std::vector<Bytes> multi_get(const std::vector<std::string>& k) override {
    return note("multi_get"), inner_->multi_get(k);
  }
  void multi_set(const std::vector<std::string>& k, const std::vector<Bytes>& v) override {
    note("multi_set");
    inner_->multi_set(k, v);
  }
  WaitGetResult wait_get(const std::vector<std::string>& k, Duration t) override {
    return note("wait_get"), inner_->wait_get(k, t);
  }
  bool can_delete_prefix() const override { return inner_->can_delete_prefix(); }
  int64_t delete_prefix(const std::string& p) override {
    return note("delete_prefix"), inner_->delete_prefix(p);
  }
  std::map<std::string, int> calls() {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_;
  }

 private:
  void note(const char* what) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++calls_[what];
  }
  std::shared_ptr<Store> inner_;
  std::mutex mutex_;
  std::map<std::string, int> calls_;
};

// A node waiting in its round learns its place with its wake-up (one WAIT_GET: "done", the
// table, its assignment, the restart count), not with a read of the state, a GET of "done" and
// a MULTI_GET after it. The round completes at MAX, so only its closer (the one that writes
// the table) reads or writes more.
TEST_F(RendezvousTest, DynamicWaitingNodesLearnTheirPlaceWithTheirWakeUp) {
  constexpr int kNodes = 6;
  std::vector<std::shared_ptr<CallCountingStore>> stores;
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  for (int i = 0; i < kNodes; ++i) {
    auto p = params("c10d", kNodes, kNodes, "h" + std::to_string(i));
    p.config["last_call_timeout"] = "30";
    TcpStoreClientOptions o;
    o.port = port_;
    o.agent = true;
    auto store = std::make_shared<CallCountingStore>(std::make_shared<TcpStoreClient>(o));
    stores.push_back(store);
    p.store = store;
    hs.push_back(create_rendezvous_handler(p));
  }
  auto rs = meet(hs);
  std::set<int64_t> ranks;
  for (auto& r : rs) ranks.insert(r.group_rank);
  EXPECT_EQ(ranks.size(), size_t(kNodes));
  int closers = 0;
  for (int i = 0; i < kNodes; ++i) {
    auto calls = stores[i]->calls();
    if (calls.count("multi_set")) {
      ++closers;
      continue;
    }
    std::string all;
    for (const auto& [what, n] : calls) all += what + "=" + std::to_string(n) + " ";
    EXPECT_GE(calls["wait_get"], 1) << "node " << i << ": " << all;
    // Joining is a read of the record, an add and one descriptor; nothing is read after the
    // wake-up (the old path: a WAIT, then GET "done", then MULTI_GET of the place). The read
    // creates the record where there is none: with all nodes started at once, the ones that
    // found none each read, created (all but one in vain) and read again.
    EXPECT_EQ(calls["get"] + calls["multi_get"] + calls["wait"], 0) << "node " << i << ": " << all;
    EXPECT_EQ(calls["set"], 1) << "node " << i << ": " << all;
    EXPECT_EQ(calls["compare_set"], 1) << "node " << i << ": " << all;
  }
  EXPECT_EQ(closers, 1);
  for (auto& h : hs) h->shutdown();
}

// Agents of one job on different builds: each publishes its build at rendezvous and every agent
// warns once, naming the builds and their hosts; the round still completes (a warning, not a
// refusal: the wire formats agree).
TEST_F(RendezvousTest, AgentsOnDifferentBuildsWarnAndStillMeet) {
  for (const std::string backend : {"static", "c10d"}) {
    std::vector<std::unique_ptr<RendezvousHandler>> hs;
    for (int64_t k : {0, 1}) {
      auto p = params(backend, 2, 2, "host-" + std::to_string(k));
      p.run_id = "mix-" + backend;
      p.node_rank = k;
      p.version = k == 0 ? "0.1.0+aaaaaaa" : "0.2.0+bbbbbbb";
      hs.push_back(create_rendezvous_handler(p));
    }
    ::testing::internal::CaptureStderr();
    auto rs = meet(hs);
    std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(rs[0].group_world_size, 2) << backend;
    EXPECT_NE(err.find("run different dlaunch builds: 0.1.0+aaaaaaa on host-0; 0.2.0+bbbbbbb on "
                       "host-1 (this agent: 0.1.0+aaaaaaa)"),
              std::string::npos)
        << backend << ": " << err;
    EXPECT_NE(err.find("(this agent: 0.2.0+bbbbbbb)"), std::string::npos) << backend << ": " << err;
    for (auto& h : hs) h->shutdown();
  }
}

TEST_F(RendezvousTest, AgentsOnOneBuildSayNothingAboutVersions) {
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  for (int64_t k : {0, 1}) {
    auto p = params("static", 2, 2, "host-" + std::to_string(k));
    p.node_rank = k;
    p.version = "0.1.0+aaaaaaa";
    hs.push_back(create_rendezvous_handler(p));
  }
  ::testing::internal::CaptureStderr();
  meet(hs);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("different dlaunch builds"), std::string::npos) << err;
}

TEST_F(RendezvousTest, DynamicCompletesAtMinAfterLastCall) {
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  for (int i = 0; i < 2; ++i) hs.push_back(create_rendezvous_handler(params("c10d", 2, 4, "h")));
  auto rs = meet(hs);
  EXPECT_EQ(rs[0].group_world_size, 2);
  EXPECT_NE(rs[0].group_rank, rs[1].group_rank);
}

// A store host of an older build (no FEATURES, no WAIT_GET): the agents fall back to the older
// requests and the rounds form as before, at MAX and at MIN after the last call (where the
// waiting nodes' slices end without news).
TEST_F(RendezvousTest, DynamicRoundsFormWithAStoreHostOlderThanWaitGet) {
  server_->stop();
  TcpStoreServerOptions o;
  o.knows_features = false;
  server_ = std::make_unique<TcpStoreServer>(o);
  port_ = server_->start();
  std::vector<std::unique_ptr<RendezvousHandler>> at_max, at_min;
  for (int i = 0; i < 3; ++i) {
    auto p = params("c10d", 2, 3, "h" + std::to_string(i));
    p.run_id = "max";
    p.config["last_call_timeout"] = "30";
    at_max.push_back(create_rendezvous_handler(p));
  }
  for (int i = 0; i < 3; ++i) {
    auto p = params("c10d", 2, 6, "h" + std::to_string(i));
    p.run_id = "min";
    p.config["keep_alive_interval"] = "0.2";  // slices of 0.2 s end before the last call
    p.config["last_call_timeout"] = "2";
    at_min.push_back(create_rendezvous_handler(p));
  }
  for (auto* hs : {&at_max, &at_min}) {
    auto rs = meet(*hs);
    std::set<int64_t> ranks;
    for (auto& r : rs) {
      EXPECT_EQ(r.group_world_size, 3);
      ranks.insert(r.group_rank);
    }
    EXPECT_EQ(ranks, (std::set<int64_t>{0, 1, 2}));
    for (auto& h : *hs) h->shutdown();
  }
}

// A liveness that can be frozen: the node looks hung (no more beats, no clean leave).
struct Freezer {
  std::atomic<bool> frozen{false};
};
LivenessFactory freezable(std::shared_ptr<Freezer> f) {
  return [f](std::shared_ptr<Store> store, const std::string& prefix, const std::string& self,
             Duration window, const Clock& clock) -> std::unique_ptr<Liveness> {
    struct L : Liveness {
      std::unique_ptr<Liveness> inner;
      std::shared_ptr<Freezer> f;
      void beat() override {
        if (!f->frozen) inner->beat();
      }
      std::vector<std::string> dead(const std::vector<std::string>& ids) override {
        return inner->dead(ids);
      }
      void leave() override {
        if (!f->frozen) inner->leave();
      }
    };
    auto l = std::make_unique<L>();
    l->inner = make_store_liveness(store, prefix, self, window, clock);
    l->f = f;
    return l;
  };
}

// Nothing escapes the keep-alive thread (an escape would std::terminate the agent): a
// liveness that throws something other than a store error is reported as a bug, and the
// keep-alive goes on beating once it stops.
TEST_F(RendezvousTest, KeepAliveThreadReportsAnUnexpectedExceptionAndGoesOn) {
  auto throws = std::make_shared<std::atomic<int>>(2);
  auto beats = std::make_shared<std::atomic<int>>(0);
  auto p = params("c10d", 1, 1, "h");
  p.config["keep_alive_interval"] = "0.1";
  p.liveness = [throws, beats](std::shared_ptr<Store> store, const std::string& prefix,
                               const std::string& self, Duration window,
                               const Clock& clock) -> std::unique_ptr<Liveness> {
    struct L : Liveness {
      std::unique_ptr<Liveness> inner;
      std::shared_ptr<std::atomic<int>> throws, beats;
      void beat() override {
        if ((*throws)-- > 0) throw std::logic_error("boom");
        inner->beat();
        ++*beats;
      }
      std::vector<std::string> dead(const std::vector<std::string>& ids) override {
        return inner->dead(ids);
      }
      void leave() override { inner->leave(); }
    };
    auto l = std::make_unique<L>();
    l->inner = make_store_liveness(store, prefix, self, window, clock);
    l->throws = throws;
    l->beats = beats;
    return l;
  };
  ::testing::internal::CaptureStderr();
  auto h = create_rendezvous_handler(p);
  h->next_rendezvous();
  bool beat = false;
  for (int i = 0; i < 200 && !beat; ++i) {
    std::this_thread::sleep_for(50ms);
    beat = *beats > 0;
  }
  h->shutdown();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(beat) << err;
  EXPECT_NE(err.find("rendezvous keep-alive: unexpected error (boom)"), std::string::npos) << err;
}

// A store error while this node reads its neighbours' keep-alives names their key: the warning
// says whose keep-alive this node was reading, and names this node, so that a line on
// 127.0.0.3 naming 127.0.0.2's key does not read as if 127.0.0.3 were 127.0.0.2.
TEST_F(RendezvousTest, KeepAliveWarningNamesThisNodeAndTheNeighbourItWasReading) {
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  auto fail_once = std::make_shared<std::atomic<bool>>(false);
  for (int i = 0; i < 2; ++i) {
    auto p = params("c10d", 2, 2, "127.0.0." + std::to_string(i + 2));
    p.config["keep_alive_interval"] = "0.1";
    if (i == 1) {
      p.liveness = [fail_once](std::shared_ptr<Store> store, const std::string& prefix,
                               const std::string& self, Duration window,
                               const Clock& clock) -> std::unique_ptr<Liveness> {
        struct L : Liveness {
          std::unique_ptr<Liveness> inner;
          std::shared_ptr<std::atomic<bool>> fail_once;
          std::string prefix;
          void beat() override { inner->beat(); }
          std::vector<std::string> dead(const std::vector<std::string>& ids) override {
            if (fail_once->exchange(false)) {
              throw TimeoutError("store 127.0.0.1:29400: ADD '" + prefix + "/hb/" + ids.at(0) +
                                 "' got no answer in time");
            }
            return inner->dead(ids);
          }
          void leave() override { inner->leave(); }
        };
        auto l = std::make_unique<L>();
        l->inner = make_store_liveness(store, prefix, self, window, clock);
        l->fail_once = fail_once;
        l->prefix = prefix;
        return l;
      };
    }
    hs.push_back(create_rendezvous_handler(p));
  }
  auto rs = meet(hs);
  ::testing::internal::CaptureStderr();
  *fail_once = true;
  for (int i = 0; i < 200 && *fail_once; ++i) std::this_thread::sleep_for(50ms);
  std::this_thread::sleep_for(300ms);  // the warning follows the failed call
  for (auto& h : hs) h->shutdown();
  std::string err = ::testing::internal::GetCapturedStderr();
  const int64_t neighbour_rank = rs[0].group_rank;
  EXPECT_NE(err.find("rendezvous keep-alive of node 127.0.0.3 (reading the keep-alives of the "
                     "nodes this node watches: node 127.0.0.2 (node rank " +
                     std::to_string(neighbour_rank) + ")"),
            std::string::npos)
      << err;
}

struct EventLog {
  std::mutex m;
  std::condition_variable cv;
  std::vector<RendezvousEvent> events;
  std::function<void(const RendezvousEvent&)> sink() {
    return [this](const RendezvousEvent& e) {
      std::lock_guard<std::mutex> lock(m);
      events.push_back(e);
      cv.notify_all();
    };
  }
  bool wait_for(size_t n, Duration d) {
    std::unique_lock<std::mutex> lock(m);
    return cv.wait_for(lock, d, [&] { return events.size() >= n; });
  }
};

TEST_F(RendezvousTest, DynamicNodeThatStopsKeepAlivesIsDetectedAndTheRestReForm) {
  auto freezer = std::make_shared<Freezer>();
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  for (int i = 0; i < 3; ++i) {
    auto p = params("c10d", 2, 3, "h" + std::to_string(i));
    p.config["keep_alive_interval"] = "0.2";
    p.config["keep_alive_max_attempt"] = "2";
    if (i == 2) p.liveness = freezable(freezer);
    hs.push_back(create_rendezvous_handler(p));
  }
  auto rs = meet(hs);
  EventLog log0, log1;
  hs[0]->watch(log0.sink());
  hs[1]->watch(log1.sink());
  auto frozen_at = std::chrono::steady_clock::now();
  freezer->frozen = true;
  ASSERT_TRUE(log0.wait_for(1, 10s));
  ASSERT_TRUE(log1.wait_for(1, 10s));
  auto detected = std::chrono::steady_clock::now() - frozen_at;
  EXPECT_EQ(log0.events[0].kind, RendezvousEvent::Kind::kMembershipChanged);
  EXPECT_NE(log0.events[0].reason.find("h2"), std::string::npos) << log0.events[0].reason;
  // A loss (the round's verdict says so), which lets an agent keep its workers for a shrink.
  EXPECT_TRUE(log0.events[0].node_gone);
  EXPECT_TRUE(log1.events[0].node_gone);
  EXPECT_LT(detected, 5s);  // window 0.4 s; generous for a loaded machine
  // Keys PyTorch workers of round 0 left behind (same TORCHELASTIC_RESTART_COUNT next round),
  // and an agent's key, outside every round's worker namespace.
  TcpStoreClientOptions co;
  co.port = port_;
  TcpStoreClient worker_store(co);
  worker_store.set("/worker/attempt_0/rank0_addr", to_bytes("stale"));
  co.agent = true;
  TcpStoreClient agent_store(co);
  agent_store.set("/other/keep", to_bytes("x"));
  const std::string round0 = worker_namespace("job1", rs[0].round);
  EXPECT_TRUE(agent_store.check({round0 + "/worker/attempt_0/rank0_addr"}));
  // The two survivors re-form a round of two.
  std::vector<std::unique_ptr<RendezvousHandler>> survivors;
  survivors.push_back(std::move(hs[0]));
  survivors.push_back(std::move(hs[1]));
  auto again = meet(survivors);
  EXPECT_EQ(again[0].group_world_size, 2);
  EXPECT_EQ(again[0].round, rs[0].round + 1);
  EXPECT_EQ(again[0].restart_count, 0);  // membership changes are free
  // A worker of the new round sees none of them; the old round's keys are gone; agents' stay.
  co.agent = false;
  TcpStoreClient new_worker(co);
  EXPECT_FALSE(new_worker.check({"/worker/attempt_0/rank0_addr"}));
  EXPECT_FALSE(agent_store.check({round0 + "/worker/attempt_0/rank0_addr"}));
  EXPECT_TRUE(agent_store.check({"/other/keep"}));
}

TEST_F(RendezvousTest, DynamicLateJoinerTriggersMembershipChangeAndIsAdmittedNextRound) {
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  for (int i = 0; i < 2; ++i) hs.push_back(create_rendezvous_handler(params("c10d", 2, 3, "h")));
  auto rs = meet(hs);
  EventLog log;
  hs[0]->watch(log.sink());
  auto late = create_rendezvous_handler(params("c10d", 2, 3, "late"));
  auto late_result = std::async(std::launch::async, [&] { return late->next_rendezvous(); });
  ASSERT_TRUE(log.wait_for(1, 10s));
  EXPECT_EQ(log.events[0].kind, RendezvousEvent::Kind::kMembershipChanged);
  EXPECT_FALSE(log.events[0].node_gone);  // a node asking in
  EXPECT_GE(hs[0]->num_nodes_waiting(), 1);
  auto again = meet(hs);
  auto l = late_result.get();
  EXPECT_EQ(l.group_world_size, 3);
  EXPECT_EQ(again[0].group_world_size, 3);
  EXPECT_EQ(again[0].round, l.round);
  // The late node arrived first in the new round; the running nodes keep their ranks.
  EXPECT_EQ(again[0].group_rank, rs[0].group_rank);
  EXPECT_EQ(again[1].group_rank, rs[1].group_rank);
  EXPECT_EQ(l.group_rank, 2);
}

TEST_F(RendezvousTest, RestartRequestIsPushedAndCountedJobWide) {
  for (const char* backend : {"static", "c10d"}) {
    std::vector<std::unique_ptr<RendezvousHandler>> hs;
    for (int64_t k = 0; k < 2; ++k) {
      auto p = params(backend, 2, 2, "h" + std::to_string(k));
      p.run_id = std::string("restart-") + backend;
      p.node_rank = k;
      hs.push_back(create_rendezvous_handler(p));
    }
    meet(hs);
    EventLog log;
    hs[1]->watch(log.sink());
    hs[0]->request_restart("rank 0 on h0 exited with code 3");
    ASSERT_TRUE(log.wait_for(1, 10s)) << backend;
    EXPECT_EQ(log.events[0].kind, RendezvousEvent::Kind::kRestartRequested);
    EXPECT_EQ(log.events[0].reason, "rank 0 on h0 exited with code 3");
    hs[1]->request_restart("a later failure: not counted");
    auto rs = meet(hs);
    EXPECT_EQ(rs[0].restart_count, 1) << backend;
    EXPECT_EQ(rs[1].restart_count, 1) << backend;
  }
}

TEST_F(RendezvousTest, ClosedRendezvousRefusesNewRounds) {
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  for (int i = 0; i < 2; ++i) hs.push_back(create_rendezvous_handler(params("c10d", 1, 2, "h")));
  meet(hs);
  EventLog log;
  hs[1]->watch(log.sink());
  hs[0]->set_closed();
  EXPECT_TRUE(hs[1]->is_closed());
  ASSERT_TRUE(log.wait_for(1, 10s));
  EXPECT_EQ(log.events[0].kind, RendezvousEvent::Kind::kShutdownRequested);
  EXPECT_THROW(hs[1]->next_rendezvous(), StateError);
}

// The narrow windows of a c10d round (issue 16): a node dying at any point of a round costs at
// most the keep-alive window (here 3 x 0.2 s), never the join timeout (here 60 s). The dead
// node is played by the test writing its records by hand and then doing nothing.
class RoundWindowTest : public RendezvousTest {
 protected:
  RendezvousParams window_params(int64_t min, int64_t max) {
    auto p = params("c10d", min, max, "h");
    p.config = {{"join_timeout", "60"}, {"last_call_timeout", "0.3"},
                {"keep_alive_interval", "0.2"}, {"keep_alive_max_attempt", "3"}};
    return p;
  }
  std::unique_ptr<TcpStoreClient> raw() {
    TcpStoreClientOptions o;
    o.port = port_;
    o.agent = true;
    return std::make_unique<TcpStoreClient>(o);
  }
  // The ghost joins round 0 first (arrival 1); described or not.
  void ghost_joins(bool describes) {
    auto s = raw();
    const std::string prefix = "dlaunch/rdzv/job1";
    s->compare_set(prefix + "/state", Bytes(), DynamicState{}.encode());
    ASSERT_EQ(s->add(prefix + "/round/0/arrivals", 1), 1);
    if (describes) {
      s->set(prefix + "/round/0/node/1", NodeDescriptor{"ghost-1", "ghost", 1, -1}.encode());
    }
  }
  std::vector<RendezvousResult> meet_two(int64_t min, int64_t max, Duration* took) {
    std::vector<std::unique_ptr<RendezvousHandler>> hs;
    for (int i = 0; i < 2; ++i) hs.push_back(create_rendezvous_handler(window_params(min, max)));
    auto start = std::chrono::steady_clock::now();
    auto rs = meet(hs);
    *took = std::chrono::steady_clock::now() - start;
    for (auto& h : hs) h->shutdown();
    return rs;
  }
};

// Window 1: counted in (add) but died before describing itself. The round goes on without it.
TEST_F(RoundWindowTest, NodeDeadBetweenCountingInAndDescribingItselfCostsTheKeepAliveWindow) {
  ghost_joins(/*describes=*/false);
  Duration took{};
  auto rs = meet_two(2, 3, &took);  // the second handler makes 3 arrivals: MAX, closes at once
  EXPECT_EQ(rs[0].group_world_size, 2);
  EXPECT_EQ(rs[1].group_world_size, 2);
  EXPECT_NE(rs[0].group_rank, rs[1].group_rank);
  EXPECT_LT(took, 5s) << "the round waited for the dead node's descriptor";
}

// Window 1 again, when the nodes left are fewer than MIN: no round below MIN forms; the next
// round opens at once and forms when a node comes to replace the dead one.
TEST_F(RoundWindowTest, NodeDeadWhileJoiningLeavingFewerThanMinOpensTheNextRound) {
  ghost_joins(/*describes=*/false);
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  for (int i = 0; i < 3; ++i) hs.push_back(create_rendezvous_handler(window_params(3, 3)));
  auto start = std::chrono::steady_clock::now();
  auto a = std::async(std::launch::async, [&] { return hs[0]->next_rendezvous(); });
  auto b = std::async(std::launch::async, [&] { return hs[1]->next_rendezvous(); });
  std::this_thread::sleep_for(1500ms);  // round 0 given up after the window (0.6 s)
  auto c = hs[2]->next_rendezvous();
  auto ra = a.get(), rb = b.get();
  EXPECT_EQ(c.round, 1);
  for (const auto* r : {&ra, &rb, &c}) EXPECT_EQ(r->group_world_size, 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 6s);
  for (auto& h : hs) h->shutdown();
}

// Window 2: the node that closed the round (compare_set to COMPLETE, closer claimed) died
// before releasing it. Another node releases it after the window.
TEST_F(RoundWindowTest, CloserDeadBeforeReleasingTheRoundCostsTheKeepAliveWindow) {
  ghost_joins(/*describes=*/true);
  raw()->add("dlaunch/rdzv/job1/round/0/closer", 1);  // the ghost claimed closing, then died
  Duration took{};
  auto rs = meet_two(3, 3, &took);
  EXPECT_EQ(rs[0].group_world_size, 3);  // the ghost is in: the keep-alive finds it dead later
  EXPECT_NE(rs[0].group_rank, rs[1].group_rank);
  EXPECT_LT(took, 5s) << "nobody released the round before the join timeout";
}

// Window 3: the first arrival measures the last call for everyone (the others wait for the
// store to wake them); when it is dead the others complete the round themselves.
TEST_F(RoundWindowTest, FirstArrivalDeadStillCompletesAfterTheLastCall) {
  ghost_joins(/*describes=*/true);
  Duration took{};
  auto rs = meet_two(2, 8, &took);
  EXPECT_EQ(rs[0].group_world_size, 3);
  EXPECT_EQ(rs[1].group_world_size, 3);
  EXPECT_LT(took, 5s) << "the round waited for a dead first arrival";
}

// The keep-alive and event threads reconnect when the store host goes away. shutdown() joins
// them, so their connects must be bounded by the keep-alive window, not the join timeout:
// otherwise an agent told to stop waits out the join timeout (600 s by default).
TEST_F(RendezvousTest, ShutdownAfterTheStoreHostDiedIsBoundedByTheKeepAliveWindow) {
  auto p = params("c10d", 1, 1, "h");
  p.config = {{"join_timeout", "120"}, {"last_call_timeout", "0.1"},
              {"keep_alive_interval", "0.2"}, {"keep_alive_max_attempt", "3"}};
  auto h = create_rendezvous_handler(p);
  h->next_rendezvous();
  h->watch([](const RendezvousEvent&) {});
  server_->stop();
  std::this_thread::sleep_for(1s);  // both threads are now reconnecting
  auto start = std::chrono::steady_clock::now();
  h->shutdown();
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, 60s) << "shutdown waited for the join timeout";
}

// The c10d store lives in one agent. When it is gone for the keep-alive window, the handler
// says so once (kStoreLost, naming the store host and the way out), and nothing waits on it
// any more: before, a round retried until the join timeout and closing waited as long again.
TEST_F(RendezvousTest, DynamicStoreHostGoneIsDeclaredLostAndNothingWaitsOnIt) {
  auto p = params("c10d", 1, 2, "h");
  p.config = {{"join_timeout", "120"}, {"last_call_timeout", "0.1"},
              {"keep_alive_interval", "0.2"}, {"keep_alive_max_attempt", "3"}};
  auto h = create_rendezvous_handler(p);
  h->next_rendezvous();
  EventLog log;
  h->watch(log.sink());
  server_->stop();
  ASSERT_TRUE(log.wait_for(1, 30s));
  EXPECT_EQ(log.events[0].kind, RendezvousEvent::Kind::kStoreLost);
  const std::string& why = log.events[0].reason;
  EXPECT_NE(why.find("127.0.0.1:" + std::to_string(port_)), std::string::npos) << why;
  EXPECT_NE(why.find("single point of failure"), std::string::npos) << why;
  EXPECT_NE(why.find("--rdzv_backend etcd"), std::string::npos) << why;
  auto start = std::chrono::steady_clock::now();
  h->set_closed();
  EXPECT_THROW(h->request_restart("rank 0 failed"), ConnectionError);
  EXPECT_EQ(h->settle_failure().kind, FailureVerdict::Kind::kStoreLost);
  EXPECT_THROW(h->next_rendezvous(), ConnectionError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s) << "waited for the join timeout";
}

// A store host that dies closes its connections, and then nothing listens on its port: that is
// conclusive, unlike silence, so with the default keep-alive (a 15 s window) the store is
// declared lost once reconnects have been refused for their bound, and the sentence says how.
TEST_F(RendezvousTest, DynamicStoreHostWhosePortRefusesIsDeclaredLostWithoutTheWindow) {
  auto p = params("c10d", 1, 1, "h");
  p.config = {{"join_timeout", "120"}, {"last_call_timeout", "0.1"}};
  auto h = create_rendezvous_handler(p);
  h->next_rendezvous();
  EventLog log;
  h->watch(log.sink());
  server_->stop();
  ASSERT_TRUE(log.wait_for(1, 60s));
  EXPECT_EQ(log.events[0].kind, RendezvousEvent::Kind::kStoreLost);
  const std::string& why = log.events[0].reason;
  EXPECT_NE(why.find("closed its connection and refuses new ones"), std::string::npos) << why;
  EXPECT_NE(why.find("127.0.0.1:" + std::to_string(port_)), std::string::npos) << why;
  EXPECT_NE(why.find("single point of failure"), std::string::npos) << why;
}

// A node waiting for its round when the store host dies hears so within the keep-alive
// window, not at the join timeout.
TEST_F(RendezvousTest, DynamicRoundWaitingOnADeadStoreFailsWithTheStoreLostSentence) {
  auto p = params("c10d", 2, 2, "h");
  p.config = {{"join_timeout", "120"}, {"last_call_timeout", "0.1"},
              {"keep_alive_interval", "0.2"}, {"keep_alive_max_attempt", "3"}};
  auto h = create_rendezvous_handler(p);
  auto round = std::async(std::launch::async, [&] { return h->next_rendezvous(); });
  std::this_thread::sleep_for(500ms);  // joined, waiting for a second node
  server_->stop();
  ASSERT_EQ(round.wait_for(30s), std::future_status::ready) << "retried until the join timeout";
  try {
    round.get();
    ADD_FAILURE() << "the round completed without a store";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("single point of failure"), std::string::npos)
        << e.what();
  }
}

// Workers fail within a second of a peer node dying (their connections break), long before
// the keep-alive can tell. The failure must not spend the budget: the verdict waits for the
// keep-alive and names the lost node, on every node alike.
TEST_F(RendezvousTest, DynamicFailureAfterANodeWentSilentIsFreeAndNamesTheNode) {
  auto freezer = std::make_shared<Freezer>();
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  for (int i = 0; i < 3; ++i) {
    auto p = params("c10d", 2, 3, "h" + std::to_string(i));
    p.config["keep_alive_interval"] = "0.2";
    p.config["keep_alive_max_attempt"] = "2";
    if (i == 2) p.liveness = freezable(freezer);
    hs.push_back(create_rendezvous_handler(p));
  }
  auto rs = meet(hs);
  EventLog log1;
  hs[1]->watch(log1.sink());
  freezer->frozen = true;  // node h2 dies: no more beats, and it never sees the failure
  hs[0]->request_restart("rank 0 on h0 failed: Connection reset by peer");
  auto v0 = std::async(std::launch::async, [&] { return hs[0]->settle_failure(); });
  auto v1 = std::async(std::launch::async, [&] { return hs[1]->settle_failure(); });
  auto a = v0.get(), b = v1.get();
  const std::string lost = "node h2 (node rank " + std::to_string(rs[2].group_rank) + ") lost";
  EXPECT_EQ(a.kind, FailureVerdict::Kind::kNodeLost);
  EXPECT_EQ(b.kind, FailureVerdict::Kind::kNodeLost);
  EXPECT_NE(a.reason.find(lost), std::string::npos) << a.reason;
  EXPECT_EQ(a.reason, b.reason);
  hs.pop_back();
  auto again = meet(hs);
  EXPECT_EQ(again[0].group_world_size, 2);
  EXPECT_EQ(again[0].restart_count, 0);
  EXPECT_EQ(again[1].restart_count, 0);
}

// A node whose own workers failed also gets the restart event of a peer that failed first: its
// report and its event watcher count it in at the same moment, and counted twice it would
// stand in for the dead node's missing count (the failure then charged, not free).
TEST_F(RendezvousTest, DynamicNodeSeeingItsFailureTwiceIsCountedOnce) {
  for (int attempt = 0; attempt < 10; ++attempt) {  // a race: several tries
    auto freezer = std::make_shared<Freezer>();
    std::vector<std::unique_ptr<RendezvousHandler>> hs;
    for (int i = 0; i < 3; ++i) {
      auto p = params("c10d", 2, 3, "h" + std::to_string(i));
      p.run_id = "twice-" + std::to_string(attempt);
      p.config["keep_alive_interval"] = "0.2";
      p.config["keep_alive_max_attempt"] = "2";
      if (i == 2) p.liveness = freezable(freezer);
      hs.push_back(create_rendezvous_handler(p));
    }
    meet(hs);
    EventLog log1;
    hs[1]->watch(log1.sink());
    freezer->frozen = true;
    auto r0 = std::async(std::launch::async, [&] { hs[0]->request_restart("rank 0 failed"); });
    auto r1 = std::async(std::launch::async, [&] { hs[1]->request_restart("rank 1 failed"); });
    r0.get();
    r1.get();
    auto v = hs[0]->settle_failure();
    EXPECT_EQ(v.kind, FailureVerdict::Kind::kNodeLost) << "attempt " << attempt << ": "
                                                        << v.reason;
    for (auto& h : hs) h->shutdown();
  }
}

// The same failure with every node alive spends one restart, job-wide, however many nodes
// settle it.
TEST_F(RendezvousTest, DynamicFailureWithEveryNodeAliveIsChargedOnce) {
  std::vector<std::unique_ptr<RendezvousHandler>> hs;
  for (int i = 0; i < 3; ++i) {
    auto p = params("c10d", 3, 3, "h" + std::to_string(i));
    p.config["keep_alive_interval"] = "0.2";
    p.config["keep_alive_max_attempt"] = "2";
    hs.push_back(create_rendezvous_handler(p));
  }
  meet(hs);
  EventLog log1, log2;
  hs[1]->watch(log1.sink());
  hs[2]->watch(log2.sink());
  hs[0]->request_restart("rank 0 on h0 exited with code 3");
  hs[1]->request_restart("rank 1 on h1: a consequence");
  std::vector<std::future<FailureVerdict>> vs;
  for (auto& h : hs) {
    vs.push_back(std::async(std::launch::async, [&h] { return h->settle_failure(); }));
  }
  for (auto& v : vs) EXPECT_EQ(v.get().kind, FailureVerdict::Kind::kCharged);
  auto again = meet(hs);
  for (auto& r : again) EXPECT_EQ(r.restart_count, 1);
}

// A client without a job token whose store goes away must not be told to check a token it
// does not have.
TEST_F(RendezvousTest, StoreDisconnectBlamesTheJobTokenOnlyWhenOneIsSet) {
  TcpStoreClientOptions co;
  co.port = port_;
  co.reconnect_timeout = 200ms;
  TcpStoreClient client(co);
  client.set("k", to_bytes("v"));
  server_->stop();
  try {
    client.get("k");
    client.get("k");
    ADD_FAILURE() << "the store answered after stop()";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("token"), std::string::npos) << e.what();
  }
}

// A node started before the store's host waits up to the join timeout (600 s by default): it
// says so at growing intervals (5, 10, 20... s; here 200, 400, 800 ms) instead of staying
// silent.
TEST(TcpStoreClientWaiting, ANodeWaitingForTheStoreHostSaysSoPeriodically) {
  TcpStoreClientOptions co;
  co.port = static_cast<uint16_t>(testing::free_port());
  co.connect_timeout = 1500ms;
  co.first_waiting_note = 200ms;
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(TcpStoreClient{co}, ConnectionError);
  std::string err = ::testing::internal::GetCapturedStderr();
  size_t first = err.find("still waiting for the store at 127.0.0.1:" + std::to_string(co.port));
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_NE(err.find("still waiting", first + 1), std::string::npos) << "said once only:\n" << err;
  EXPECT_NE(err.find("node rank 0"), std::string::npos) << err;
}

// An agent with another job token is refused by the store; the store's node says so, and its
// "never joined" message names the token instead of only the missing node.
TEST(RendezvousJobToken, NeverJoinedNamesTheTokenWhenAClientWasRefused) {
  TcpStoreServerOptions so;
  so.token = "right";
  TcpStoreServer server(so);
  uint16_t port = server.start();
  int64_t before = job_token_refusals();
  TcpStoreClientOptions co;
  co.port = port;
  co.token = "wrong";
  co.connect_timeout = 2s;
  EXPECT_THROW(TcpStoreClient{co}, StateError);
  ASSERT_TRUE([&] {
    auto until = std::chrono::steady_clock::now() + 10s;
    while (job_token_refusals() == before && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(10ms);
    }
    return job_token_refusals() > before;
  }()) << "the server did not count the refused client";
  RendezvousParams p;
  p.backend = "static";
  p.run_id = "tok";
  p.min_nodes = p.max_nodes = 2;
  p.node_rank = 0;
  p.endpoint = "127.0.0.1:" + std::to_string(port);
  p.host = "h0";
  p.token = "right";
  p.config = {{"join_timeout", "1"}};
  auto h = create_rendezvous_handler(p);
  try {
    h->next_rendezvous();
    ADD_FAILURE() << "formed a round of two with one node";
  } catch (const TimeoutError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("never joined"), std::string::npos) << m;
    EXPECT_NE(m.find("refused"), std::string::npos) << m;
    EXPECT_NE(m.find("DLAUNCH_JOB_TOKEN"), std::string::npos) << m;
    EXPECT_NE(m.find("after 1 s (join_timeout)"), std::string::npos) << m;  // not 1.000000 s
  }
}

// stop() used to join a thread parked in a store wait for up to one slice (every multi-node
// agent exited ~1 s late); it now interrupts that wait. The slice here is a minute, so a stop
// bounded by the slice cannot pass.
TEST_F(RendezvousTest, EventWatcherStopInterruptsTheBlockedWait) {
  std::atomic<int> opened{0};
  EventWatcher watcher(
      [&]() -> std::shared_ptr<Store> {
        ++opened;
        TcpStoreClientOptions o;
        o.port = port_;
        return std::make_shared<TcpStoreClient>(o);
      },
      "job1", "node-a", 60s);
  watcher.watch(0, [](const RendezvousEvent&) {});
  // Let the thread connect and park its WAIT on the server.
  auto until = std::chrono::steady_clock::now() + 10s;
  while (opened == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(opened, 1);
  std::this_thread::sleep_for(200ms);
  auto t0 = std::chrono::steady_clock::now();
  watcher.stop();
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, 1s) << "stop() took "
                      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                      << " ms";
}

// prepare() connects while the round forms, also with the agents' lazily connecting clients:
// watch() after the round opens nothing more (with N agents released at once, N connects there
// competed with their spawns), and an event is still delivered. A prepared connect that fails
// is tried again once armed.
TEST_F(RendezvousTest, EventWatcherPreparedAheadConnectsOnceBeforeTheWatch) {
  for (bool first_connect_fails : {false, true}) {
    SCOPED_TRACE(first_connect_fails ? "the prepared connect fails" : "it succeeds");
    std::atomic<int> opened{0};
    EventWatcher watcher(
        [&]() -> std::shared_ptr<Store> {
          if (++opened == 1 && first_connect_fails) throw ConnectionError("refused (test)");
          TcpStoreClientOptions o;
          o.port = port_;
          o.lazy_connect = true;  // as detail::store_opener makes them
          return std::make_shared<TcpStoreClient>(o);
        },
        first_connect_fails ? "job3" : "job2", "node-a", 60s);
    watcher.prepare();
    // The server's count of open connections: the first round runs on a fresh server; in the
    // second, the first round's closed connections may still be counted for a moment.
    auto until = std::chrono::steady_clock::now() + 10s;
    while ((opened == 0 || (!first_connect_fails && server_->stats().connections < 1)) &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(10ms);
    }
    ASSERT_EQ(opened, 1);
    if (!first_connect_fails) {
      EXPECT_EQ(server_->stats().connections, 1) << "prepare() did not connect before any watch()";
    }
    std::promise<RendezvousEvent> got;
    watcher.watch(0, [&](const RendezvousEvent& e) { got.set_value(e); });
    TcpStoreClientOptions o;
    o.port = port_;
    TcpStoreClient peer(o);
    ASSERT_TRUE(publish_event(peer, first_connect_fails ? "job3" : "job2", 0,
                              {RendezvousEvent::Kind::kRestartRequested, "node-b", "rank 3 failed"}));
    auto f = got.get_future();
    ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "the event was not delivered";
    EXPECT_EQ(f.get().reason, "rank 3 failed");
    EXPECT_EQ(opened, first_connect_fails ? 2 : 1);
  }
}

TEST(RendezvousRegistry, UnknownBackendAndBadConf) {
  RendezvousParams p;
  p.backend = "zookeeper";
  EXPECT_THROW(create_rendezvous_handler(p), UsageError);
  EXPECT_THROW(RendezvousConfig::split("join_timeout"), UsageError);
  auto conf = RendezvousConfig::parse(RendezvousConfig::split("join_timeout=5,last_call_timeout=0.5"));
  EXPECT_EQ(conf.join_timeout, std::chrono::seconds(5));
  EXPECT_EQ(conf.last_call_timeout, std::chrono::milliseconds(500));
  EXPECT_THROW(RendezvousConfig::parse({{"keep_alive_interval", "x"}}), UsageError);
}

}  // namespace
}  // namespace dlaunch
