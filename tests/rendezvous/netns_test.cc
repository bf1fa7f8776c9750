// Hosts in network namespaces joined by veth pairs (root and iproute2 only; skipped otherwise):
// three rdzv_agent processes meet through the store hosted in namespace A; cutting C's link
// (a partition, not a process death) must be noticed by the others within the keep-alive
// window, and A and B re-form a round of two. Further tests run real dlaunch agents there: a link
// cut while workers fail, dtrain across two hosts, and a Kubernetes pod deletion whose
// replacement (a UTS namespace with the same hostname) joins at a new address.
//
//       [ns dl_b] 10.77.1.2 --veth-- 10.77.1.1 [ns dl_a: store + agent] 10.77.2.1 --veth-- 10.77.2.2 [ns dl_c]
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

// A child process whose stdout we read line by line.
class Proc {
 public:
  Proc(const std::vector<std::string>& argv) {
    int p[2];
    if (pipe(p) != 0) throw std::runtime_error("pipe");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(p[1], 1);
      ::close(p[0]);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    ::close(p[1]);
    fd_ = p[0];
    fcntl(fd_, F_SETFL, O_NONBLOCK);
  }
  ~Proc() {
    if (!reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    ::close(fd_);
  }
  void signal(int sig) {
    if (!reaped_) kill(pid_, sig);
  }
  // Reads its output until it exits or `timeout` passes; its shell exit code (128 + N for
  // signal N), or -1 when it still runs.
  int wait_exit(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!reaped_) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        code_ = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) return -1;
      wait_line("never a line", 100ms);
    }
    wait_line("never a line", 100ms);  // what it wrote last
    return code_;
  }
  // Reads until a line starting with `prefix` arrives or `timeout` passes; returns it or "".
  std::string wait_line(const std::string& prefix, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      size_t nl;
      while ((nl = buf_.find('\n')) != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        all_ += line + "\n";
        if (line.rfind(prefix, 0) == 0) return line;
      }
      char b[512];
      ssize_t n = read(fd_, b, sizeof(b));
      if (n > 0) {
        buf_.append(b, n);
      } else {
        std::this_thread::sleep_for(20ms);
      }
    }
    return "";
  }
  const std::string& output() const { return all_; }

 private:
  pid_t pid_;
  int fd_;
  bool reaped_ = false;
  int code_ = -1;
  std::string buf_, all_;
};

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root for ip netns";
    // The namespaces and links have fixed names: one test at a time on this host (ctest -j runs
    // each test in its own process).
    lock_fd_ = ::open("/tmp/dlaunch_netns_test.lock", O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    ASSERT_GE(lock_fd_, 0);
    ASSERT_EQ(::flock(lock_fd_, LOCK_EX), 0);
    if (sh("ip netns add dl_probe_" + std::to_string(getpid())) != 0) {
      GTEST_SKIP() << "ip netns unavailable (iproute2 missing or no CAP_SYS_ADMIN)";
    }
    sh("ip netns del dl_probe_" + std::to_string(getpid()));
    teardown();
    const char* setup[] = {
        "ip netns add dl_a", "ip netns add dl_b", "ip netns add dl_c",
        "ip link add dl_ab type veth peer name dl_ba",
        "ip link add dl_ac type veth peer name dl_ca",
        "ip link set dl_ab netns dl_a", "ip link set dl_ba netns dl_b",
        "ip link set dl_ac netns dl_a", "ip link set dl_ca netns dl_c",
        "ip -n dl_a addr add 10.77.1.1/24 dev dl_ab", "ip -n dl_b addr add 10.77.1.2/24 dev dl_ba",
        "ip -n dl_a addr add 10.77.2.1/24 dev dl_ac", "ip -n dl_c addr add 10.77.2.2/24 dev dl_ca",
        "ip -n dl_a link set dl_ab up", "ip -n dl_a link set dl_ac up", "ip -n dl_a link set lo up",
        "ip -n dl_b link set dl_ba up", "ip -n dl_b link set lo up",
        "ip -n dl_c link set dl_ca up", "ip -n dl_c link set lo up",
    };
    for (const char* cmd : setup) ASSERT_EQ(sh(cmd), 0) << cmd;
  }
  void TearDown() override {
    teardown();
    if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
  }
  int lock_fd_ = -1;
  static void teardown() {
    for (const char* ns : {"dl_a", "dl_b", "dl_c"}) sh(std::string("ip netns del ") + ns);
  }
};

std::string agent_binary() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = std::string(self, n > 0 ? n : 0);
  return dir.substr(0, dir.rfind('/')) + "/rdzv_agent";
}

// rdzv_agent on the three hosts, node-a serving the store on `port`, with --nnodes 2:3 and the
// rendezvous `conf`; returns once each is in round 0 with all 3 nodes.
using RdzvAgents = std::array<std::unique_ptr<Proc>, 3>;
void start_rdzv_agents_in_round_0(const std::string& conf, int port, RdzvAgents* agents) {
  auto agent = [&](const char* ns, const std::string& endpoint, const char* host, bool serve) {
    std::vector<std::string> argv = {"ip", "netns", "exec", ns, agent_binary(), "--endpoint",
                                     endpoint, "--host", host, "--nnodes", "2:3", "--conf", conf};
    if (serve) {
      argv.push_back("--serve");
      argv.push_back("0.0.0.0");
    }
    return std::make_unique<Proc>(argv);
  };
  std::string p = std::to_string(port);
  (*agents)[0] = agent("dl_a", "127.0.0.1:" + p, "node-a", true);
  std::this_thread::sleep_for(300ms);
  (*agents)[1] = agent("dl_b", "10.77.1.1:" + p, "node-b", false);
  (*agents)[2] = agent("dl_c", "10.77.2.1:" + p, "node-c", false);
  for (auto& agent_proc : *agents) {
    std::string line = agent_proc->wait_line("ROUND", 30s);
    ASSERT_EQ(line.substr(0, 8), "ROUND 0 ") << agent_proc->output();
    ASSERT_EQ(line.substr(line.rfind(' ') + 1), "3") << line;
  }
}

TEST_F(NetnsTest, PartitionedNodeIsDetectedAndTheOthersReForm) {
  const std::string conf = "keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=0.5,join_timeout=60";
  RdzvAgents agents;
  ASSERT_NO_FATAL_FAILURE(start_rdzv_agents_in_round_0(conf, 29477, &agents));
  auto& [a, b, c] = agents;
  auto cut = std::chrono::steady_clock::now();
  ASSERT_EQ(sh("ip -n dl_c link set dl_ca down"), 0);
  std::string ev_a = a->wait_line("EVENT", 20s);
  std::string ev_b = b->wait_line("EVENT", 20s);
  auto noticed = std::chrono::steady_clock::now() - cut;
  EXPECT_NE(ev_a.find("membership"), std::string::npos) << a->output();
  EXPECT_NE(ev_b.find("membership"), std::string::npos) << b->output();
  EXPECT_NE((ev_a + ev_b).find("node-c"), std::string::npos) << ev_a << ev_b;
  // Window 1 s: noticed well within keep-alive window + slack on a loaded machine.
  EXPECT_LT(noticed, 10s);
  std::string ra = a->wait_line("ROUND", 20s), rb = b->wait_line("ROUND", 20s);
  EXPECT_EQ(ra.substr(0, 8), "ROUND 1 ") << a->output();
  EXPECT_EQ(ra.substr(ra.rfind(' ') + 1), "2") << ra;
  EXPECT_EQ(rb.substr(rb.rfind(' ') + 1), "2") << rb;
}

// A cut shorter than the keep-alive window (12 s against 4.5 s x 3), as a switch reboot makes:
// the cut node's reads wait out TCP's retransmissions and are answered after the link is back,
// about 12.6 s after they were asked (the retransmission after 0.2 + 0.4 + ... + 6.4 s), within
// the reads' timeout (the window). That time is the cut node's own silence: it must not then
// report its healthy neighbours (the store host among them) as lost. Counted as theirs, it left
// them 0.9 s of the window, less than their interval: most runs named them.
// The others may see the cut node silent for the window (its last beat came up to an interval
// before the cut) and re-form once; the last call (10 s) outlasts the cut node's way back (its
// watcher hears of the re-form at the latest 6.4 s after the link is back), so it joins that
// round, not a later one.
TEST_F(NetnsTest, ShortLinkCutReFormsAtMostOnceAndTheCutNodeBlamesNobody) {
  const std::string conf = "keep_alive_interval=4.5,keep_alive_max_attempt=3,"
                           "last_call_timeout=10,join_timeout=60";
  RdzvAgents agents;
  ASSERT_NO_FATAL_FAILURE(start_rdzv_agents_in_round_0(conf, 29476, &agents));
  auto& [a, b, c] = agents;
  std::this_thread::sleep_for(3s);  // every node has read its neighbours' counters a few times
  ASSERT_EQ(sh("ip -n dl_c link set dl_ca down"), 0);
  std::this_thread::sleep_for(12s);
  ASSERT_EQ(sh("ip -n dl_c link set dl_ca up"), 0);
  // Long enough for a late retransmission (up to 12.8 s after the cut), a re-form's last call
  // and the window.
  a->wait_line("never a line", 30s);
  for (auto* p : {b.get(), c.get()}) p->wait_line("never a line", 1s);  // buffered meanwhile
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  for (auto* p : {a.get(), b.get(), c.get()}) {
    EXPECT_EQ(p->output().find("node node-a"), std::string::npos) << p->output();
    EXPECT_EQ(p->output().find("node node-b"), std::string::npos) << p->output();
    EXPECT_EQ(p->output().find("ERROR"), std::string::npos) << p->output();
    // Round 0, and at most one re-form.
    EXPECT_LE(count(p->output(), "ROUND "), 2u) << "re-formed more than once:\n" << p->output();
  }
}

// A link cut (not a process death) while real dlaunch agents run workers that then fail, as
// gloo's would when a peer stops answering: with --max_restarts 0 the two connected nodes must
// re-form and finish without spending the budget, naming node-c as lost; node-c, cut off from
// the store, exits with the store-host sentence.
TEST_F(NetnsTest, LinkCutWhileWorkersFailReformsWithoutSpendingTheBudget) {
  // Last call 2 s: the first round has all three nodes even if one starts late.
  const std::string conf =
      "keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=2,join_timeout=60";
  char tmpl[] = "/tmp/dl_netns_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string trigger = std::string(tmpl) + "/fail";
  auto agent = [&](const char* ns, const char* endpoint, const char* local_addr) {
    std::string cmd = std::string("exec ") + DLAUNCH_BIN + " --nnodes 2:3 --max_restarts 0" +
                      " --rdzv_backend c10d --rdzv_id netnsfail --rdzv_endpoint " + endpoint +
                      " --local_addr " + local_addr + " --rdzv_conf " + conf + " " +
                      TEST_WORKER_BIN + " fail-first-attempt-when file=" + trigger + " 2>&1";
    return std::make_unique<Proc>(
        std::vector<std::string>{"ip", "netns", "exec", ns, "sh", "-c", cmd});
  };
  auto a = agent("dl_a", "0.0.0.0:29478", "10.77.1.1");
  std::this_thread::sleep_for(300ms);
  auto b = agent("dl_b", "10.77.1.1:29478", "10.77.1.2");
  auto c = agent("dl_c", "10.77.2.1:29478", "10.77.2.2");
  for (auto* p : {a.get(), b.get(), c.get()}) {
    std::string line = p->wait_line("[dlaunch", 30s);
    ASSERT_FALSE(line.empty()) << p->output();
  }
  for (auto* p : {a.get(), b.get(), c.get()}) {
    // "attempt 0: starting 1 worker(s), ... of 3 (node k of 3)"
    std::string line;
    for (int i = 0; i < 50 && line.find("attempt 0: starting") == std::string::npos; ++i) {
      line = p->wait_line("[dlaunch", 30s);
    }
    ASSERT_NE(line.find("of 3)"), std::string::npos) << p->output();
  }
  ASSERT_EQ(sh("ip -n dl_c link set dl_ca down"), 0);
  ASSERT_EQ(sh("touch " + trigger), 0);  // every worker fails now, node-c's too
  for (auto* p : {a.get(), b.get()}) {
    std::string ok = p->wait_line("[default0]:ok", 60s);
    EXPECT_NE(ok.find("world=2 attempt=1 restart_count=0"), std::string::npos) << p->output();
    EXPECT_NE(p->output().find("node 10.77.2.2 (node rank "), std::string::npos) << p->output();
    EXPECT_NE(p->output().find("not counted as a restart"), std::string::npos) << p->output();
  }
  std::string lost = c->wait_line("[dlaunch", 30s);
  for (int i = 0; i < 50 && c->output().find("single point of failure") == std::string::npos; ++i) {
    lost = c->wait_line("[dlaunch", 30s);
  }
  EXPECT_NE(c->output().find("single point of failure"), std::string::npos) << c->output();
  // The cut-off node does not claim the job is over: the others trained on.
  EXPECT_NE(c->output().find("if only this node was cut off, the job may go on without it"),
            std::string::npos)
      << c->output();
  sh(std::string("rm -rf ") + tmpl);
}

// dtrain on two hosts that share a hostname (network namespaces do; so do hosts whose
// /etc/hosts maps the hostname to 127.0.1.1, Debian's default): each worker must advertise to
// gloo the address it reaches the store's host from, not its hostname's loopback address.
TEST_F(NetnsTest, DtrainAcrossTwoHostsFormsItsGlooGroupOnRoutableAddresses) {
  char tmpl[] = "/tmp/dl_netns_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  auto agent = [&](const char* ns, const char* endpoint, const char* local_addr) {
    std::string cmd = std::string("exec ") + DLAUNCH_BIN + " --nnodes 2 --nproc_per_node 1" +
                      " --rdzv_backend c10d --rdzv_id netnsdtrain --rdzv_endpoint " + endpoint +
                      " --local_addr " + local_addr + " --max_restarts 0 " + DTRAIN_BIN +
                      " --dataset synthetic --epochs 1 --max_steps 2 --eval_every 0 --width 4" +
                      " --batch_size 16 --output_dir " + tmpl + "/out 2>&1";
    return std::make_unique<Proc>(
        std::vector<std::string>{"ip", "netns", "exec", ns, "sh", "-c", cmd});
  };
  auto a = agent("dl_a", "0.0.0.0:29479", "10.77.1.1");
  std::this_thread::sleep_for(300ms);
  auto b = agent("dl_b", "10.77.1.1:29479", "10.77.1.2");
  for (auto* p : {a.get(), b.get()}) {
    auto deadline = std::chrono::steady_clock::now() + 180s;
    std::string line;
    while (line.find("finished successfully") == std::string::npos &&
           line.find(" E]") == std::string::npos && line.find("error") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline) {
      line = p->wait_line("", 5s);
    }
    EXPECT_NE(line.find("all 1 worker(s) finished successfully"), std::string::npos) << p->output();
  }
  sh(std::string("rm -rf ") + tmpl);
}

// Kubernetes pod deletion in an elastic job (--nnodes 2:4, --max_restarts 0): node-c's agent gets
// SIGTERM (then SIGKILL, had it outlived the pod's grace). Its workers die of the forwarded
// SIGTERM and the others' fail as gloo's would; that is a node leaving, not a failure: a and b
// re-form free, and node-c exits 143 without a report. Two workers per node: on SIGTERM local
// rank 0 dies at once and local rank 1 takes 3 s (it writes a checkpoint), so the others' workers
// fail while node-c's agent still runs. Then a new pod comes with the same
// hostname (a UTS namespace per pod, as Kubernetes gives: trainer-node-2) at a new address
// (node-c's link renumbered, 10.77.2.2 -> 10.77.2.3), joins, and the job finishes on three nodes.
TEST_F(NetnsTest, DeletedPodLeavesFreeAndItsReplacementWithTheSameHostnameJoins) {
  char tmpl[] = "/tmp/dl_netns_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string ready = tmpl;
  const std::string conf =
      "last_call_timeout=2,keep_alive_interval=0.5,keep_alive_max_attempt=4,join_timeout=60";
  // No --local_addr but on the store's host (the headless service's address): each node is
  // known by its hostname, as a pod is.
  auto pod = [&](const char* ns, const char* hostname, const std::string& endpoint,
                 const std::string& extra, const std::string& worker_mode) {
    std::string cmd = std::string("hostname ") + hostname + " && exec " + DLAUNCH_BIN +
                      " --nnodes 2:4 --max_restarts 0 --rdzv_backend c10d --rdzv_id netnspod" +
                      " --nproc_per_node 2 --rdzv_endpoint " + endpoint + extra +
                      " --rdzv_conf " + conf + " " + TEST_WORKER_BIN + " " + worker_mode +
                      " ready=" + ready + " slow_stop=3 finish_world=6 2>&1";
    return std::make_unique<Proc>(std::vector<std::string>{"ip", "netns", "exec", ns, "unshare",
                                                           "--uts", "sh", "-c", cmd});
  };
  auto a = pod("dl_a", "trainer-node-0", "0.0.0.0:29481", " --local_addr 10.77.1.1",
               "fail-when-peer-dies");
  std::this_thread::sleep_for(300ms);
  auto b = pod("dl_b", "trainer-node-1", "10.77.1.1:29481", "", "fail-when-peer-dies");
  auto c = pod("dl_c", "trainer-node-2", "10.77.2.1:29481", "", "fail-when-peer-dies");
  for (auto* p : {a.get(), b.get(), c.get()}) {
    std::string line;
    for (int i = 0; i < 50 && line.find("attempt 0: starting") == std::string::npos; ++i) {
      line = p->wait_line("[dlaunch", 30s);
    }
    ASSERT_NE(line.find("of 6 (node"), std::string::npos) << p->output();
  }
  for (int rank = 0; rank < 6; ++rank) {
    const std::string file = ready + "/ready." + std::to_string(rank);
    for (int i = 0; i < 600 && access(file.c_str(), F_OK) != 0; ++i) {
      std::this_thread::sleep_for(100ms);
    }
  }

  c->signal(SIGTERM);
  int code = c->wait_exit(30s);  // Kubernetes' default grace
  if (code < 0) {
    c->signal(SIGKILL);
    code = c->wait_exit(10s);
  }
  EXPECT_EQ(code, 128 + SIGTERM) << c->output();
  EXPECT_EQ(c->output().find("job FAILED"), std::string::npos) << c->output();
  EXPECT_EQ(c->output().find("Root cause"), std::string::npos) << c->output();
  EXPECT_EQ(c->output().find(") failed:"), std::string::npos) << c->output();
  for (auto* p : {a.get(), b.get()}) {
    std::string waiting = p->wait_line("[default0]:waiting", 60s);
    EXPECT_NE(waiting.find("world=4 attempt=1 restart_count=0"), std::string::npos)
        << p->output();
    EXPECT_NE(p->output().find("node trainer-node-2 (node rank "), std::string::npos)
        << p->output();
    EXPECT_NE(p->output().find("not counted as a restart"), std::string::npos) << p->output();
  }

  // The new pod: same hostname, new address. Its worker (a first attempt) just succeeds.
  ASSERT_EQ(sh("ip -n dl_c addr del 10.77.2.2/24 dev dl_ca"), 0);
  ASSERT_EQ(sh("ip -n dl_c addr add 10.77.2.3/24 dev dl_ca"), 0);
  auto replacement = pod("dl_c", "trainer-node-2", "10.77.2.1:29481", "", "ok");
  for (auto* p : {a.get(), b.get()}) {
    std::string ok = p->wait_line("[default0]:ok", 60s);
    EXPECT_NE(ok.find("world=6 attempt=2 restart_count=0"), std::string::npos) << p->output();
  }
  for (auto* p : {a.get(), b.get(), replacement.get()}) {
    EXPECT_EQ(p->wait_exit(60s), 0) << p->output();
  }
  EXPECT_NE(replacement->output().find("attempt 0: starting 2 worker(s), global ranks"),
            std::string::npos)
      << replacement->output();
  sh(std::string("rm -rf ") + tmpl);
}

}  // namespace
