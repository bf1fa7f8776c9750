// Several real dlaunch agents on 127.0.0.1 forming one job: static and c10d rendezvous through
// the agent-hosted store, global ranks by node rank, and a failure on one node pushed to the
// other so every node restarts together.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN;
const std::string kWorker = TEST_WORKER_BIN;

std::map<std::string, std::string> env_of(const std::string& out, int local_rank) {
  std::map<std::string, std::string> env;
  std::string prefix = "[default" + std::to_string(local_rank) + "]:";
  for (const auto& line : lines_with_prefix(out, prefix)) {
    std::string kv = line.substr(prefix.size());
    size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

// The first agent that does not host the job's store (killing the host is another test); size()
// when every one does.
size_t first_node_not_hosting_the_store(const std::vector<std::unique_ptr<Subprocess>>& nodes) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i]->err().find("hosting the job's store") == std::string::npos) return i;
  }
  return nodes.size();
}

TEST(DlaunchMultiNode, StaticRanksFollowNodeRank) {
  std::string port = std::to_string(free_port());
  // Node 1 starts first: it must wait for node 0 (the store host) to come up.
  auto n1 = std::make_unique<Subprocess>(std::vector<std::string>{
      kDlaunch, "--nnodes", "2", "--node_rank", "1", "--master_port", port, "--nproc_per_node",
      "1", "--rdzv_id", "static1", kWorker, "print-env"});
  auto n0 = std::make_unique<Subprocess>(std::vector<std::string>{
      kDlaunch, "--nnodes", "2", "--node_rank", "0", "--master_port", port, "--nproc_per_node",
      "2", "--rdzv_id", "static1", kWorker, "print-env"});
  auto e0 = n0->wait(60s);
  auto e1 = n1->wait(60s);
  ASSERT_TRUE(e0 && e1) << n0->err() << n1->err();
  EXPECT_EQ(e0->shell_code(), 0) << n0->err();
  EXPECT_EQ(e1->shell_code(), 0) << n1->err();
  auto a = env_of(n0->out(), 0), b = env_of(n0->out(), 1), c = env_of(n1->out(), 0);
  EXPECT_EQ(a["RANK"], "0");
  EXPECT_EQ(b["RANK"], "1");
  EXPECT_EQ(c["RANK"], "2");  // node 1's workers come after node 0's
  for (auto* e : {&a, &b, &c}) {
    EXPECT_EQ((*e)["WORLD_SIZE"], "3");
    EXPECT_EQ((*e)["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ((*e)["MASTER_PORT"], port);
    EXPECT_EQ((*e)["TORCHELASTIC_RUN_ID"], "static1");
    EXPECT_EQ((*e)["TORCHELASTIC_USE_AGENT_STORE"], "True");
  }
  EXPECT_EQ(c["GROUP_RANK"], "1");
  EXPECT_EQ(c["LOCAL_WORLD_SIZE"], "1");
  EXPECT_EQ(a["LOCAL_WORLD_SIZE"], "2");
}

// A command line copied to two agents on one host claims one node rank twice; the message
// must tell the two apart (they share the host name), by pid.
TEST(DlaunchMultiNode, TwoAgentsOnOneHostClaimingOneNodeRankAreNamedByPid) {
  std::string port = std::to_string(free_port());
  auto node = [&](const std::string& rank) {
    return std::make_unique<Subprocess>(std::vector<std::string>{
        kDlaunch, "--nnodes", "3", "--node_rank", rank, "--master_port", port, "--rdzv_id",
        "dup", "--rdzv_conf", "join_timeout=20", kWorker, "ok"});
  };
  auto n0 = node("0");
  auto a = node("1");
  auto b = node("1");
  std::string all;
  for (auto* n : {&n0, &a, &b}) {
    auto e = (*n)->wait(60s);
    ASSERT_TRUE(e) << (*n)->err();
    EXPECT_NE(e->shell_code(), 0) << (*n)->err();
    all += (*n)->err();
  }
  EXPECT_NE(all.find("node rank 1 is claimed by two agents"), std::string::npos) << all;
  EXPECT_NE(all.find("(pid " + std::to_string(a->pid()) + ")"), std::string::npos) << all;
  EXPECT_NE(all.find("(pid " + std::to_string(b->pid()) + ")"), std::string::npos) << all;
}

TEST(DlaunchMultiNode, FailureOnOneNodeRestartsEveryNode) {
  std::string port = std::to_string(free_port());
  auto node = [&](const std::string& rank) {
    // Global rank 1 (node 1) crashes on the first attempt; rank 0 (node 0) runs until stopped
    // then, so the restart must be pushed to node 0 while its worker runs.
    return std::make_unique<Subprocess>(std::vector<std::string>{
        kDlaunch, "--nnodes", "2", "--node_rank", rank, "--master_port", port, "--max_restarts",
        "1", "--rdzv_id", "push", kWorker, "crash-once", "rank=1", "others=wait-once"});
  };
  auto n0 = node("0");
  auto n1 = node("1");
  auto e1 = n1->wait(90s);
  auto e0 = n0->wait(90s);
  ASSERT_TRUE(e0 && e1) << n0->err() << n1->err();
  EXPECT_EQ(e1->shell_code(), 0) << n1->err();
  EXPECT_EQ(e0->shell_code(), 0) << n0->err();
  EXPECT_NE(n0->err().find("another node asked for a restart"), std::string::npos) << n0->err();
  EXPECT_NE(n0->out().find("restart_count=1"), std::string::npos) << n0->out();
  EXPECT_NE(n1->out().find("restart_count=1"), std::string::npos) << n1->out();
}

TEST(DlaunchMultiNode, ElasticC10dTwoAgents) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        kDlaunch, "--nnodes", "2:3", "--rdzv_endpoint", endpoint, "--rdzv_id", "elastic1",
        "--rdzv_conf", "last_call_timeout=0.5", kWorker, "print-env"}));
  }
  std::set<std::string> ranks;
  for (auto& n : nodes) {
    auto e = n->wait(60s);
    ASSERT_TRUE(e) << n->err();
    EXPECT_EQ(e->shell_code(), 0) << n->err();
    auto env = env_of(n->out(), 0);
    EXPECT_EQ(env["WORLD_SIZE"], "2") << n->out();
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
    ranks.insert(env["RANK"]);
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1"}));
}

// A third agent of a full 2:2 job says why it waits, instead of waiting without a word.
TEST(DlaunchMultiNode, AnAgentOfAFullJobSaysItWaitsForAPlace) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  TempDir ready;
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        kDlaunch, "--nnodes", "2:2", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
        "--rdzv_id", "full", kWorker, "sleep", "ready=" + ready.path()}));
  }
  ASSERT_TRUE(wait_ready(ready, 2, 60s));
  Subprocess extra({kDlaunch, "--nnodes", "2:2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                    endpoint, "--rdzv_id", "full", kWorker, "sleep"});
  EXPECT_TRUE(wait_until(
      [&] { return extra.err().find("the job is full (2 of --nnodes MAX=2 nodes)") !=
                   std::string::npos; },
      30s))
      << extra.err();
  extra.signal(SIGTERM);
  EXPECT_TRUE(extra.wait(30s));
  for (auto& n : nodes) {
    n->signal(SIGTERM);
    EXPECT_TRUE(n->wait(30s));
  }
}

// When the full job then finishes normally, the waiting agent says so and exits 0: the job
// succeeded and it had no part in it. It used to take the store's end for its death (exit 1).
TEST(DlaunchMultiNode, AnAgentWaitingForAPlaceExitsZeroWhenTheJobFinishes) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  TempDir dir;
  // Runs until the test creates `go`.
  const std::string worker = "touch \"" + dir.path() + "/ready.$RANK\"; while [ ! -e \"" +
                             dir.path() + "/go\" ]; do sleep 0.1; done";
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        kDlaunch, "--nnodes", "2:2", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
        "--rdzv_id", "fullends", "--no_python", "/bin/sh", "-c", worker}));
  }
  ASSERT_TRUE(wait_ready(dir, 2, 60s));
  Subprocess extra({kDlaunch, "--nnodes", "2:2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                    endpoint, "--rdzv_id", "fullends", "--no_python", "/bin/sh", "-c", worker});
  ASSERT_TRUE(wait_until(
      [&] { return extra.err().find("the job is full") != std::string::npos; }, 30s))
      << extra.err();
  std::ofstream(dir.file("go")).close();
  for (auto& n : nodes) {
    auto e = n->wait(60s);
    ASSERT_TRUE(e) << n->err();
    EXPECT_EQ(e->shell_code(), 0) << n->err();
  }
  auto e = extra.wait(60s);
  ASSERT_TRUE(e) << extra.err();
  EXPECT_EQ(e->shell_code(), 0) << extra.err();
  EXPECT_NE(extra.err().find("the job finished"), std::string::npos) << extra.err();
  EXPECT_EQ(extra.err().find("died"), std::string::npos) << extra.err();
}

// An agent SIGKILLed mid-run (not the one hosting the store): the others notice through the
// keep-alive, stop their workers and re-form with the smaller world, without spending the
// restart budget (--max_restarts 0).
TEST(DlaunchMultiNode, ElasticNodeLossReformsWithoutSpendingRestarts) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  TempDir ready;
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        kDlaunch, "--nnodes", "2:3", "--rdzv_endpoint", endpoint, "--rdzv_id", "loss",
        "--rdzv_conf", "last_call_timeout=0.5,keep_alive_interval=1,keep_alive_max_attempt=3",
        kWorker, "wait-first-attempt", "ready=" + ready.path()}));
  }
  ASSERT_TRUE(wait_ready(ready, 3, 60s));
  size_t victim = first_node_not_hosting_the_store(nodes);
  ASSERT_LT(victim, nodes.size());
  nodes[victim]->signal(SIGKILL);
  ASSERT_TRUE(nodes[victim]->wait(30s));
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == victim) continue;
    auto e = nodes[i]->wait(60s);
    ASSERT_TRUE(e) << nodes[i]->err();
    EXPECT_EQ(e->shell_code(), 0) << nodes[i]->err();
    EXPECT_NE(nodes[i]->out().find("world=2 attempt=1"), std::string::npos) << nodes[i]->out();
    EXPECT_NE(nodes[i]->err().find("not counted as a restart"), std::string::npos)
        << nodes[i]->err();
  }
}

// The agent hosting the c10d store (the job's single point of failure) is SIGKILLed while
// every worker runs: the others must notice within the keep-alive window, stop their workers
// and exit with one sentence naming the store host. They used to run on (their workers never
// failed), or retry until the join timeout (600 s here), then wait that long again to close.
// Three c10d agents on `endpoint` with `rdzv_conf`; once their workers run, the one hosting the
// store is SIGKILLed. Calls `check` with each other agent's exit and stderr.
void kill_the_store_host_of_three(
    const std::string& endpoint, const std::string& run_id, const std::string& rdzv_conf,
    const std::function<void(const ExitInfo&, const std::string&)>& check) {
  TempDir ready;
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        kDlaunch, "--nnodes", "2:3", "--rdzv_endpoint", endpoint, "--rdzv_id", run_id,
        "--rdzv_conf", rdzv_conf, kWorker, "sleep", "ready=" + ready.path()}));
  }
  ASSERT_TRUE(wait_ready(ready, 3, 60s));
  size_t host = nodes.size();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i]->err().find("hosting the job's store") != std::string::npos) host = i;
  }
  ASSERT_LT(host, nodes.size());
  nodes[host]->signal(SIGKILL);
  ASSERT_TRUE(nodes[host]->wait(30s));
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == host) continue;
    auto e = nodes[i]->wait(60s);  // the window is at most 15 s; the join timeout 600 s
    ASSERT_TRUE(e) << "still running a minute after the store host died:\n" << nodes[i]->err();
    check(*e, nodes[i]->err());
  }
}

TEST(DlaunchMultiNode, StoreHostKilledEndsEveryOtherAgentWithOneSentence) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  kill_the_store_host_of_three(
      endpoint, "hostloss", "last_call_timeout=0.5,keep_alive_interval=1,keep_alive_max_attempt=3",
      [&](const ExitInfo& e, const std::string& err) {
        EXPECT_EQ(e.shell_code(), 1) << err;
        EXPECT_EQ(count_of(err, "single point of failure"), 1u) << err;
        EXPECT_NE(err.find("c10d store at " + endpoint), std::string::npos) << err;
        EXPECT_NE(err.find("--rdzv_backend etcd"), std::string::npos) << err;
      });
}

// The same with the default keep-alive (a 15 s window): a SIGKILLed store host closes its
// connections and its port then refuses, which is conclusive, so the others do not wait out the
// window meant for silence; their sentence says what they saw.
TEST(DlaunchMultiNode, StoreHostKilledWithDefaultSettingsIsSeenByItsClosedPort) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  kill_the_store_host_of_three(
      endpoint, "hostclosed", "last_call_timeout=0.5",
      [&](const ExitInfo& e, const std::string& err) {
        EXPECT_EQ(e.shell_code(), 1) << err;
        EXPECT_EQ(count_of(err, "single point of failure"), 1u) << err;
        EXPECT_NE(err.find("c10d store at " + endpoint +
                           " (--rdzv_endpoint) closed its connection and refuses new ones"),
                  std::string::npos)
            << err;
      });
}

// SIGTERM must end an agent within the shutdown grace at any point, also while its workers
// failed and it waits on a dead store (here for a long keep-alive window, with restarts
// left). It used to block its event loop reconnecting until the join timeout.
TEST(DlaunchMultiNode, SigtermEndsAnAgentWaitingOnADeadStore) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  TempDir ready;
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        kDlaunch, "--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
        "--rdzv_id", "termdead", "--max_restarts", "3", "--rdzv_conf",
        "last_call_timeout=0.5,keep_alive_interval=5,keep_alive_max_attempt=60", kWorker,
        "fail-when-peer-dies", "ready=" + ready.path()}));
  }
  ASSERT_TRUE(wait_until(
      [&] { return file_exists(ready.file("ready.0")) && file_exists(ready.file("ready.1")); },
      60s));
  size_t host = nodes[0]->err().find("hosting the job's store") != std::string::npos ? 0 : 1;
  Subprocess& other = *nodes[1 - host];
  nodes[host]->signal(SIGKILL);
  ASSERT_TRUE(nodes[host]->wait(30s));
  // Its worker fails at once (the peer is gone); the agent now waits on the dead store.
  ASSERT_TRUE(wait_until(
      [&] { return other.err().find("failed: exit code 1") != std::string::npos; }, 30s))
      << other.err();
  std::this_thread::sleep_for(1s);
  other.signal(SIGTERM);
  auto e = other.wait(30s);  // --shutdown_grace 5 s; the window 300 s, the join timeout 600 s
  ASSERT_TRUE(e) << "SIGTERM did not end the agent:\n" << other.err();
  EXPECT_EQ(e->shell_code(), 128 + SIGTERM) << other.err();
}

// Three agents, --max_restarts 0: one is SIGKILLed, and the survivors' workers fail at once
// (as gloo does when a peer is gone). That is node loss, not a worker failure: the survivors
// re-form without spending the budget, finish, and name the lost node as the cause.
TEST(DlaunchMultiNode, NodeKilledWhileItsPeersFailDoesNotSpendTheRestartBudget) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  TempDir ready;
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        // last call 3 s: round 0 has all three nodes even when one agent starts late on a
        // busy machine (a late one would join a second round as its first attempt).
        kDlaunch, "--nnodes", "1:3", "--rdzv_endpoint", endpoint, "--rdzv_id", "lossfail",
        "--max_restarts", "0", "--rdzv_conf",
        "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3", kWorker,
        "fail-when-peer-dies", "ready=" + ready.path()}));
  }
  ASSERT_TRUE(wait_ready(ready, 3, 60s));
  size_t victim = first_node_not_hosting_the_store(nodes);
  ASSERT_LT(victim, nodes.size());
  nodes[victim]->signal(SIGKILL);
  ASSERT_TRUE(nodes[victim]->wait(30s));
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == victim) continue;
    auto e = nodes[i]->wait(60s);
    ASSERT_TRUE(e) << nodes[i]->err();
    EXPECT_EQ(e->shell_code(), 0) << nodes[i]->err();
    EXPECT_NE(nodes[i]->out().find("world=2 attempt=1 restart_count=0"), std::string::npos)
        << nodes[i]->out() << nodes[i]->err();
    // Its agent was SIGKILLed: its store connection closed, so it is lost before the window.
    EXPECT_NE(nodes[i]->err().find(") lost (its agent's store connection closed"),
              std::string::npos)
        << nodes[i]->err();
    EXPECT_NE(nodes[i]->err().find("not counted as a restart"), std::string::npos)
        << nodes[i]->err();
  }
}

// 2 agents x 2 PyTorch workers (Debian's python3-torch 1.13, gloo): init_process_group over the
// node-0 agent's store, then all_reduce across both nodes.
TEST(DlaunchMultiNode, PyTorchAllReduceAcrossTwoAgents) {
  auto probe = run({"/usr/bin/python3", "-c", "import torch.distributed"});
  if (probe.timed_out || probe.exit.shell_code() != 0) {
    GTEST_SKIP() << "Debian's python3-torch is not installed for /usr/bin/python3";
  }
  std::string port = std::to_string(free_port());
  std::string script = std::string(SOURCE_DIR) + "/examples/single_node/allreduce.py";
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (const char* rank : {"0", "1"}) {
    nodes.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        kDlaunch, "--nnodes", "2", "--node_rank", rank, "--master_port", port, "--nproc_per_node",
        "2", "--rdzv_id", "torch2x2", "--python", "/usr/bin/python3", script}));
  }
  std::string all_out;
  for (auto& n : nodes) {
    auto e = n->wait(240s);
    ASSERT_TRUE(e) << n->err();
    EXPECT_EQ(e->shell_code(), 0) << n->out() << n->err();
    all_out += n->out();
  }
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(all_out.find("rank " + std::to_string(r) + "/4: all_reduce sum 6"), std::string::npos)
        << all_out;
  }
}

// A service that is not a store, listening on 127.0.0.1: it accepts every connection, writes
// `answer` to it (nothing: it stays silent) and keeps it open until destroyed.
class ForeignService {
 public:
  explicit ForeignService(std::string answer) : answer_(std::move(answer)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
        ::listen(listen_fd_, 16) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      throw std::runtime_error("cannot listen on 127.0.0.1");
    }
    port_ = ntohs(sa.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~ForeignService() {
    stop_ = true;
    thread_.join();
    for (int fd : accepted_) ::close(fd);
    ::close(listen_fd_);
  }
  uint16_t port() const { return port_; }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      if (!answer_.empty()) (void)::send(fd, answer_.data(), answer_.size(), MSG_NOSIGNAL);
      accepted_.push_back(fd);
    }
  }
  std::string answer_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<int> accepted_;
  std::thread thread_;
};

// Another service holds the c10d endpoint's port: the agent cannot host the store there, joins
// as a client, and must name that service within seconds. It used to wait the whole join
// timeout with nothing in its log, then blame "the agent hosting" the store.
TEST(DlaunchMultiNode, SilentServiceOnTheC10dPortIsNamedWhileTheAgentWaits) {
  ForeignService service("");
  const std::string endpoint = "127.0.0.1:" + std::to_string(service.port());
  const std::string sentence = endpoint + " answers but is not a dlaunch or PyTorch store";
  Subprocess agent({kDlaunch, "--nnodes", "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                    endpoint, "--rdzv_id", "foreign", "--rdzv_conf", "join_timeout=25", kWorker,
                    "ok"});
  // The handshake gives up after 5 s; the join timeout is 25 s.
  ASSERT_TRUE(wait_until([&] { return agent.err().find(sentence) != std::string::npos; }, 30s))
      << agent.err();
  EXPECT_FALSE(agent.wait(0ms)) << "said only when it gave up:\n" << agent.err();
  auto e = agent.wait(90s);
  ASSERT_TRUE(e) << agent.err();
  EXPECT_NE(e->shell_code(), 0) << agent.err();
  const std::string err = agent.err();
  EXPECT_NE(err.find(sentence, err.find(sentence) + 1), std::string::npos)
      << "the final error must say it too:\n" << err;
  EXPECT_EQ(err.find("agent hosting it"), std::string::npos) << err;
}

// A service that answers bytes no store sends ends the join at once.
TEST(DlaunchMultiNode, ServiceAnsweringGarbageOnTheC10dPortEndsTheJoinAtOnce) {
  ForeignService service("HTTP/1.1 400 Bad Request\r\n\r\n");
  const std::string endpoint = "127.0.0.1:" + std::to_string(service.port());
  Subprocess agent({kDlaunch, "--nnodes", "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                    endpoint, "--rdzv_id", "foreign", "--rdzv_conf", "join_timeout=600", kWorker,
                    "ok"});
  auto e = agent.wait(30s);  // the join timeout is 600 s
  ASSERT_TRUE(e) << "still joining:\n" << agent.err();
  EXPECT_NE(e->shell_code(), 0) << agent.err();
  EXPECT_NE(agent.err().find(endpoint + " answers but is not a dlaunch or PyTorch store"),
            std::string::npos)
      << agent.err();
  EXPECT_EQ(agent.err().find("agent hosting it"), std::string::npos) << agent.err();
}

}  // namespace
}  // namespace dlaunch::testing
