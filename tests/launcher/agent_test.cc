// The agent's supervision logic against a fake process context: scripted exits, recorded
// signals, a FakeClock for the hang rule. Real processes are covered by the integration tests.
#include "launcher/agent/agent.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "launcher/hang/hang_exchange.h"
#include "tests/support/subprocess.h"
#include "rendezvous/store/in_memory_store.h"
#include "rendezvous/handlers/rendezvous_handler.h"

namespace dlaunch {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

struct Behaviour {
  std::optional<ExitStatus> exit;  // exits by itself after `after`; nullopt: runs until signaled
  Duration after = 1ms;
  bool ignore_sigterm = false;
  bool unkillable = false;  // ignores even SIGKILL, like a process stuck in state D
};

class FakeProcessContext : public ProcessContext {
 public:
  explicit FakeProcessContext(asio::io_context& io) : io_(io) {}

  // (local rank, attempt) -> behaviour.
  std::function<Behaviour(int64_t local_rank, int64_t attempt)> script;
  std::string missing_program;
  std::vector<SpawnRequest> spawned;
  std::vector<std::pair<int, int>> signals;  // (pid, signal)

  int spawn(const SpawnRequest& req, ProcessCallbacks cb) override {
    if (req.argv[0] == missing_program) throw SpawnError("program '" + missing_program + "' was not found");
    spawned.push_back(req);
    int pid = next_pid_++;
    auto env = [&](const std::string& k) {
      for (const auto& [key, v] : req.env)
        if (key == k) return v;
      return std::string();
    };
    Behaviour b = script(std::stoll(env("LOCAL_RANK")), std::stoll(env("DLAUNCH_ATTEMPT")));
    procs_[pid] = {std::move(cb), b, true};
    if (b.exit) {
      auto timer = std::make_shared<asio::steady_timer>(io_, b.after);
      ExitStatus st = *b.exit;
      timer->async_wait([this, timer, pid, st](const boost::system::error_code&) { end(pid, st); });
    }
    return pid;
  }
  void signal_group(int pid, int sig) override {
    signals.emplace_back(pid, sig);
    auto it = procs_.find(pid);
    if (it == procs_.end() || !it->second.alive) return;
    if (sig == SIGTERM && it->second.b.ignore_sigterm) return;
    if (it->second.b.unkillable) return;
    asio::post(io_, [this, pid, sig]() { end(pid, ExitStatus::killed(sig)); });
  }
  // Processes the workers leave behind when they exit 0 (an uploader): each ends by itself
  // `ends_by_itself` after it is first seen, or `ends_after_sigterm` after its SIGTERM, or
  // never; SIGKILL (kill_orphans) ends every one.
  struct Leftover {
    std::string name;
    std::optional<Duration> ends_after_sigterm;
    std::optional<Duration> ends_by_itself;
    bool seen = false;
    bool alive = true;
    bool got_sigterm = false;
    bool killed = false;
  };
  std::vector<Leftover> leftovers;

  std::vector<std::string> signal_leftovers(int sig, std::function<void()> on_gone) override {
    std::vector<std::string> names;
    for (auto& l : leftovers) {
      if (!l.alive) continue;
      names.push_back(l.name);
      std::optional<Duration> ends;
      if (!l.seen) ends = l.ends_by_itself;
      l.seen = true;
      if (sig == SIGTERM) {
        l.got_sigterm = true;
        if (l.ends_after_sigterm) ends = l.ends_after_sigterm;
      }
      if (!ends) continue;
      auto timer = std::make_shared<asio::steady_timer>(io_, *ends);
      timer->async_wait([this, timer, &l](const boost::system::error_code&) {
        if (!l.alive) return;
        l.alive = false;
        if (on_leftovers_gone_ && live_leftovers().empty()) {
          auto done = std::move(on_leftovers_gone_);
          on_leftovers_gone_ = nullptr;
          done();
        }
      });
    }
    if (!names.empty()) on_leftovers_gone_ = std::move(on_gone);
    return names;
  }
  std::vector<std::string> live_leftovers() override {
    std::vector<std::string> names;
    for (auto& l : leftovers)
      if (l.alive) names.push_back(l.name);
    return names;
  }
  std::vector<std::string> kill_orphans(Duration) override {
    on_leftovers_gone_ = nullptr;
    for (auto& l : leftovers) {
      if (l.alive) l.killed = true;
      l.alive = false;
    }
    return {};
  }
  void reap_orphan_zombies() override {}
  std::string process_state(int pid) override {
    auto it = procs_.find(pid);
    if (it == procs_.end() || !it->second.alive) return "";
    return it->second.b.unkillable ? "D" : "S";
  }
  int count_signals(int sig) const {
    int n = 0;
    for (auto& s : signals) n += s.second == sig;
    return n;
  }

 private:
  struct Proc {
    ProcessCallbacks cb;
    Behaviour b;
    bool alive;
  };
  void end(int pid, ExitStatus st) {
    auto& p = procs_[pid];
    if (!p.alive) return;
    p.alive = false;
    p.cb.on_exit(st);
  }
  asio::io_context& io_;
  std::function<void()> on_leftovers_gone_;
  std::map<int, Proc> procs_;
  int next_pid_ = 1000;
};

LaunchConfig config(int nproc, int max_restarts) {
  LaunchConfig c;
  c.nproc_per_node = nproc;
  c.max_restarts = max_restarts;
  c.master_port = 29999;
  c.program = "/fake/worker";
  c.shutdown_grace = 50ms;
  return c;
}

AgentOptions options() {
  AgentOptions o;
  o.host = "testhost";
  o.handle_signals = false;
  o.capture_stacks = false;
  o.kill_wait = 100ms;
  o.cpus = 4;
  o.base_env = {{"PATH", "/usr/bin:/bin"}};
  return o;
}

std::string env_of(const SpawnRequest& r, const std::string& key) {
  for (const auto& [k, v] : r.env)
    if (k == key) return v;
  return "<unset>";
}

TEST(Agent, AllWorkersSucceed) {
  asio::io_context io;
  FakeProcessContext procs(io);
  procs.script = [](int64_t, int64_t) { return Behaviour{ExitStatus::exited(0)}; };
  Agent agent(config(3, 0), procs, io, options());
  EXPECT_EQ(agent.run(), exit_codes::kSuccess);
  ASSERT_EQ(procs.spawned.size(), 3u);
  EXPECT_EQ(env_of(procs.spawned[2], "RANK"), "2");
  EXPECT_EQ(env_of(procs.spawned[2], "WORLD_SIZE"), "3");
  EXPECT_EQ(env_of(procs.spawned[0], "OMP_NUM_THREADS"), "1");  // 4 cores / 3 workers
  EXPECT_EQ(env_of(procs.spawned[0], "MASTER_PORT"), "29999");
  EXPECT_EQ(env_of(procs.spawned[0], "PATH"), "/usr/bin:/bin");
  EXPECT_EQ(procs.count_signals(SIGTERM), 0);
}

TEST(Agent, FailureStopsTheOthersAndExitsOne) {
  asio::io_context io;
  FakeProcessContext procs(io);
  procs.script = [](int64_t lr, int64_t) {
    return lr == 1 ? Behaviour{ExitStatus::exited(3)} : Behaviour{};
  };
  Agent agent(config(3, 0), procs, io, options());
  EXPECT_EQ(agent.run(), exit_codes::kWorkersFailed);
  EXPECT_EQ(procs.count_signals(SIGTERM), 2);  // the two survivors
  EXPECT_EQ(agent.restarts_used(), 0);
}

TEST(Agent, RestartIncrementsTheRestartCount) {
  asio::io_context io;
  FakeProcessContext procs(io);
  procs.script = [](int64_t lr, int64_t attempt) {
    if (attempt == 0 && lr == 0) return Behaviour{ExitStatus::killed(SIGSEGV)};
    if (attempt == 0) return Behaviour{};
    return Behaviour{ExitStatus::exited(0)};
  };
  Agent agent(config(2, 3), procs, io, options());
  EXPECT_EQ(agent.run(), exit_codes::kSuccess);
  EXPECT_EQ(agent.restarts_used(), 1);
  ASSERT_EQ(procs.spawned.size(), 4u);
  EXPECT_EQ(env_of(procs.spawned[0], "TORCHELASTIC_RESTART_COUNT"), "0");
  EXPECT_EQ(env_of(procs.spawned[3], "TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_EQ(env_of(procs.spawned[3], "TORCHELASTIC_MAX_RESTARTS"), "3");
  EXPECT_NE(env_of(procs.spawned[3], "TORCHELASTIC_ERROR_FILE").find("/attempt_1/1/"),
            std::string::npos);
}

TEST(Agent, BudgetRunsOut) {
  asio::io_context io;
  FakeProcessContext procs(io);
  procs.script = [](int64_t, int64_t) { return Behaviour{ExitStatus::exited(1)}; };
  Agent agent(config(1, 2), procs, io, options());
  EXPECT_EQ(agent.run(), exit_codes::kWorkersFailed);
  EXPECT_EQ(agent.generations(), 3);
  EXPECT_EQ(agent.restarts_used(), 2);
}

TEST(Agent, WorkerIgnoringSigtermIsKilledAfterTheGrace) {
  asio::io_context io;
  FakeProcessContext procs(io);
  procs.script = [](int64_t lr, int64_t) {
    if (lr == 0) return Behaviour{ExitStatus::exited(2), 5ms};
    Behaviour b;
    b.ignore_sigterm = true;
    return b;
  };
  Agent agent(config(2, 0), procs, io, options());
  EXPECT_EQ(agent.run(), exit_codes::kWorkersFailed);
  EXPECT_GE(procs.count_signals(SIGKILL), 1);
}

TEST(Agent, AProcessThatCannotDieIsAbandonedNotWaitedFor) {
  asio::io_context io;
  FakeProcessContext procs(io);
  procs.script = [](int64_t lr, int64_t) {
    if (lr == 0) return Behaviour{ExitStatus::exited(1), 5ms};
    Behaviour b;
    b.unkillable = true;
    return b;
  };
  Agent agent(config(2, 3), procs, io, options());
  // Bounded: grace (50 ms) + kill wait (100 ms), then the stuck worker is abandoned. The
  // restarts go on without waiting for it.
  EXPECT_EQ(agent.run(), exit_codes::kWorkersFailed);
  EXPECT_EQ(agent.generations(), 4);
  EXPECT_GE(procs.count_signals(SIGKILL), 4);
}

// An uploader started with Popen by a worker that then exits 0 was SIGKILLed at once, silently.
// It now gets SIGTERM and --shutdown_grace to end; here it ends well within the grace.
TEST(Agent, BackgroundChildrenOfASuccessfulWorkerMayFinishWithinTheGraceUntouched) {
  asio::io_context io;
  FakeProcessContext procs(io);
  procs.script = [](int64_t, int64_t) { return Behaviour{ExitStatus::exited(0)}; };
  procs.leftovers = {{"pid 77 (python3 upload.py)", std::nullopt, 20ms}};
  auto cfg = config(2, 0);
  cfg.shutdown_grace = 60s;  // ended by the leftover's own exit, not by the grace
  Agent agent(cfg, procs, io, options());
  ::testing::internal::CaptureStderr();
  int code = agent.run();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, exit_codes::kSuccess);
  EXPECT_FALSE(procs.leftovers[0].got_sigterm) << "signalled although it finished in the grace";
  EXPECT_FALSE(procs.leftovers[0].killed) << "SIGKILLed although it ended within the grace";
  EXPECT_NE(err.find("W] the workers exited 0 but left 1 process(es) running: pid 77 (python3 "
                     "upload.py); letting them finish"),
            std::string::npos)
      << err;
}

TEST(Agent, BackgroundChildrenStillRunningAfterTheGraceGetSigterm) {
  asio::io_context io;
  FakeProcessContext procs(io);
  procs.script = [](int64_t, int64_t) { return Behaviour{ExitStatus::exited(0)}; };
  procs.leftovers = {{"pid 77 (python3 serve.py)", 20ms}};
  Agent agent(config(1, 0), procs, io, options());  // grace 50 ms
  ::testing::internal::CaptureStderr();
  int code = agent.run();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, exit_codes::kSuccess);
  EXPECT_TRUE(procs.leftovers[0].got_sigterm);
  EXPECT_FALSE(procs.leftovers[0].killed) << "SIGKILLed although SIGTERM ended it";
  EXPECT_NE(err.find("pid 77 (python3 serve.py); sending SIGTERM"), std::string::npos) << err;
}

TEST(Agent, BackgroundChildrenIgnoringSigtermAreKilledAfterTheGraceWithAWarning) {
  asio::io_context io;
  FakeProcessContext procs(io);
  procs.script = [](int64_t, int64_t) { return Behaviour{ExitStatus::exited(0)}; };
  procs.leftovers = {{"pid 78 (sleep 1000)", std::nullopt}, {"pid 79 (true)", 1ms}};
  Agent agent(config(1, 0), procs, io, options());  // grace 50 ms
  ::testing::internal::CaptureStderr();
  int code = agent.run();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, exit_codes::kSuccess);
  EXPECT_TRUE(procs.leftovers[0].got_sigterm);
  EXPECT_TRUE(procs.leftovers[0].killed);
  EXPECT_FALSE(procs.leftovers[1].killed);
  EXPECT_NE(err.find("W] 1 process(es) the workers left still run"), std::string::npos) << err;
  EXPECT_NE(err.find("after the workers exited: pid 78 (sleep 1000); sending SIGKILL"),
            std::string::npos)
      << err;
}

TEST(Agent, MissingProgramIsUsage) {
  asio::io_context io;
  FakeProcessContext procs(io);
  procs.missing_program = "/fake/worker";
  procs.script = [](int64_t, int64_t) { return Behaviour{}; };
  Agent agent(config(2, 5), procs, io, options());
  EXPECT_EQ(agent.run(), exit_codes::kUsage);
  EXPECT_EQ(agent.generations(), 1);  // no restart for a program that cannot run
}

TEST(Agent, HangIsDetectedOnTheInjectedClock) {
  asio::io_context io;
  FakeProcessContext procs(io);
  procs.script = [](int64_t, int64_t) { return Behaviour{}; };  // run until stopped
  FakeClock clock;
  auto opts = options();
  opts.clock = &clock;
  int64_t beats_read = 0;
  opts.last_beat = [&](const std::string&) -> std::optional<TimePoint> {
    ++beats_read;
    return std::nullopt;
  };
  auto cfg = config(2, 0);
  cfg.hang_timeout = 1s;  // checked every 250 ms of real time against the fake clock
  cfg.hang_timeout_from_start = true;  // the workers never beat
  // Jump the fake clock past the timeout once the workers run.
  asio::steady_timer jump(io, 20ms);
  jump.async_wait([&](const boost::system::error_code&) { clock.advance(5s); });
  Agent agent(cfg, procs, io, opts);
  EXPECT_EQ(agent.run(), exit_codes::kWorkersFailed);
  EXPECT_GE(beats_read, 1);
  EXPECT_EQ(procs.count_signals(SIGTERM), 2);
}

TEST(Agent, FreshHeartbeatsKeepWorkersHealthy) {
  asio::io_context io;
  FakeProcessContext procs(io);
  procs.script = [](int64_t, int64_t) { return Behaviour{ExitStatus::exited(0), 600ms}; };
  FakeClock clock;
  auto opts = options();
  opts.clock = &clock;
  opts.last_beat = [&](const std::string&) -> std::optional<TimePoint> { return clock.now(); };
  auto cfg = config(2, 0);
  cfg.hang_timeout = 100ms;
  asio::steady_timer jump(io, 20ms);
  jump.async_wait([&](const boost::system::error_code&) { clock.advance(5s); });
  Agent agent(cfg, procs, io, opts);
  EXPECT_EQ(agent.run(), exit_codes::kSuccess);
}

// A scripted rendezvous: every round has 2 nodes of 2 workers, this node is node 1; events are
// fired by the test through the callback the agent registered with watch().
class FakeRendezvous : public RendezvousHandler {
 public:
  std::string backend() const override { return "fake"; }
  std::string run_id() const override { return "fake"; }
  RendezvousResult next_rendezvous() override {
    std::lock_guard<std::mutex> lock(mutex_);
    RendezvousResult r;
    r.round = rounds_++;
    r.group_rank = 1;
    r.group_world_size = 2;
    r.local_world_sizes = {3, 2};
    r.hosts = {"a", "b"};
    r.master_addr = "10.0.0.1";
    r.master_port = 29400;
    r.restart_count = restart_count_;
    r.store = store;
    return r;
  }
  // An event fired before the agent watches is delivered when it does, as the real handlers'
  // watchers read the round's event key, which keeps it (the agent watches only after spawning
  // its workers, and a script may fire as soon as a worker is spawned).
  void watch(std::function<void(const RendezvousEvent&)> cb) override {
    std::vector<RendezvousEvent> pending;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      on_event_ = cb;
      pending.swap(pending_);
    }
    for (const RendezvousEvent& ev : pending) cb(ev);
  }
  void request_restart(const std::string& report) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++restart_count_;
    reports.push_back(report);
  }
  int64_t num_nodes_waiting() override { return 0; }
  void set_closed() override { closed = true; }
  bool is_closed() override { return closed; }
  void shutdown() override { shut_down = true; }
  FailureVerdict settle_failure() override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++settled;
    return verdict;
  }

  void fire(RendezvousEvent::Kind kind, const std::string& reason, bool spends) {
    std::function<void(const RendezvousEvent&)> cb;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (spends) ++restart_count_;
      if (!on_event_) {  // not watched yet: kept for watch()
        pending_.push_back(RendezvousEvent{kind, reason});
        return;
      }
      cb = on_event_;
    }
    cb(RendezvousEvent{kind, reason});
  }
  int64_t rounds() {
    std::lock_guard<std::mutex> lock(mutex_);
    return rounds_;
  }
  std::vector<std::string> reports;
  bool closed = false;
  bool shut_down = false;
  FailureVerdict verdict;  // what settle_failure() answers
  int settled = 0;
  std::shared_ptr<Store> store;  // the rounds' job store (hang verdicts); none when null

 private:
  std::mutex mutex_;
  int64_t rounds_ = 0;
  int64_t restart_count_ = 0;
  std::function<void(const RendezvousEvent&)> on_event_;
  std::vector<RendezvousEvent> pending_;
};

TEST(AgentRendezvous, RanksComeFromTheRoundAndEventsRestart) {
  asio::io_context io;
  FakeProcessContext procs(io);
  auto rdzv = std::make_shared<FakeRendezvous>();
  // Attempt 0: run until stopped, and a node joins (free restart). Attempt 1: run until
  // stopped, another node fails (spends the budget). Attempt 2: succeed.
  procs.script = [&](int64_t lr, int64_t attempt) {
    if (lr == 1 && attempt < 2) {
      auto kind = attempt == 0 ? RendezvousEvent::Kind::kMembershipChanged
                               : RendezvousEvent::Kind::kRestartRequested;
      // From another thread, as the handler's watcher would.
      std::thread([rdzv, kind, attempt]() {
        rdzv->fire(kind, attempt == 0 ? "node 2 joined" : "rank 0 on a failed", attempt == 1);
      }).detach();
    }
    return attempt < 2 ? Behaviour{} : Behaviour{ExitStatus::exited(0)};
  };
  auto opts = options();
  opts.rendezvous = rdzv;
  opts.use_agent_store = true;
  Agent agent(config(2, 1), procs, io, opts);
  EXPECT_EQ(agent.run(), exit_codes::kSuccess);
  EXPECT_EQ(agent.generations(), 3);
  EXPECT_EQ(rdzv->rounds(), 3);
  EXPECT_EQ(agent.restarts_used(), 1);  // the membership change was free
  ASSERT_EQ(procs.spawned.size(), 6u);
  // Node 1 of sizes {3, 2}: global ranks 3 and 4 of 5; the store is the round's.
  EXPECT_EQ(env_of(procs.spawned[0], "RANK"), "3");
  EXPECT_EQ(env_of(procs.spawned[1], "RANK"), "4");
  EXPECT_EQ(env_of(procs.spawned[1], "WORLD_SIZE"), "5");
  EXPECT_EQ(env_of(procs.spawned[1], "GROUP_RANK"), "1");
  EXPECT_EQ(env_of(procs.spawned[1], "MASTER_ADDR"), "10.0.0.1");
  EXPECT_EQ(env_of(procs.spawned[1], "TORCHELASTIC_USE_AGENT_STORE"), "True");
  EXPECT_EQ(env_of(procs.spawned[2], "TORCHELASTIC_RESTART_COUNT"), "0");  // after the join
  EXPECT_EQ(env_of(procs.spawned[4], "TORCHELASTIC_RESTART_COUNT"), "1");  // after the failure
  EXPECT_EQ(env_of(procs.spawned[4], "DLAUNCH_ATTEMPT"), "2");
  EXPECT_TRUE(rdzv->shut_down);
  EXPECT_FALSE(rdzv->closed);
}

// A peer's restart request that comes while this node's own workers are silent past
// --hang_timeout (in a chaos soak: while the agent still took their stacks) kills them at once:
// stopped or stuck in a collective, they cannot act on SIGTERM, and waiting --shutdown_grace
// for them only kept this node out of the next round.
TEST(AgentRendezvous, SilentWorkersGetSigkillAtOnceWhenAPeerAsksForARestart) {
  asio::io_context io;
  FakeProcessContext procs(io);
  auto rdzv = std::make_shared<FakeRendezvous>();
  FakeClock clock;
  procs.script = [&](int64_t lr, int64_t attempt) {
    if (attempt > 0) return Behaviour{ExitStatus::exited(0)};
    if (lr == 1) {
      // On the loop thread once both have started, before the hang check's first look.
      asio::post(io, [&clock, rdzv]() {
        clock.advance(5s);
        std::thread([rdzv]() {
          rdzv->fire(RendezvousEvent::Kind::kRestartRequested, "rank 0 on a hung", true);
        }).detach();
      });
    }
    Behaviour b;
    b.ignore_sigterm = true;  // as a SIGSTOPped process does
    return b;
  };
  auto opts = options();
  opts.rendezvous = rdzv;
  opts.use_agent_store = true;
  opts.clock = &clock;
  opts.last_beat = [](const std::string&) -> std::optional<TimePoint> { return std::nullopt; };
  auto cfg = config(2, 1);
  cfg.hang_timeout = 1s;
  cfg.hang_timeout_from_start = true;  // the workers never beat
  cfg.shutdown_grace = 30s;
  Agent agent(cfg, procs, io, opts);
  EXPECT_EQ(agent.run(), exit_codes::kSuccess);
  ASSERT_EQ(procs.spawned.size(), 4u);
  for (int pid : {1000, 1001}) {  // attempt 0's workers: SIGKILL first, no grace
    auto first = std::find_if(procs.signals.begin(), procs.signals.end(),
                              [pid](const auto& s) { return s.first == pid; });
    ASSERT_NE(first, procs.signals.end()) << pid;
    EXPECT_EQ(first->second, SIGKILL) << "pid " << pid << " got signal " << first->second << " first";
  }
}

// A rank hung on the other node (node 0): its agent saw it first, wrote its hang verdict and
// asked for a restart while this node's workers, blocked in a collective with it, were silent
// but not yet past --hang_timeout. This node takes the hang exchange's verdict before it stops,
// so its report names the rank stuck on node 0 the way node 0's does, not as "restart requested
// by another node".
TEST(AgentRendezvous, APeersRestartRequestDuringAHangTakesTheHangExchangesVerdict) {
  asio::io_context io;
  FakeProcessContext procs(io);
  auto rdzv = std::make_shared<FakeRendezvous>();
  rdzv->store = std::make_shared<InMemoryStore>();
  FakeClock clock;
  procs.script = [&](int64_t lr, int64_t attempt) {
    if (lr == 1 && attempt == 0) {
      // On the loop thread once both have started: the peer's verdict and request come before
      // this node's own hang check could name anyone.
      asio::post(io, [&clock, rdzv]() {
        clock.advance(6s);  // silent for more than half of --hang_timeout, not all of it
        NodeHangVerdict stuck;
        stuck.node_rank = 0;
        stuck.host = "a";
        stuck.stuck_here = true;
        stuck.rank = 2;
        stuck.local_rank = 2;
        stuck.pid = 4242;
        stuck.where = "wait_for_a_batch (train.py:22)";
        rdzv->store->set(hang_verdict_key(0, 0), to_bytes(encode_hang_verdict(stuck)));
        std::thread([rdzv]() {
          rdzv->fire(RendezvousEvent::Kind::kRestartRequested,
                     "rank 2 on a hung (no heartbeat for 10.0 s) in wait_for_a_batch "
                     "(train.py:22)",
                     true);
        }).detach();
      });
    }
    return Behaviour{};
  };
  auto opts = options();
  opts.rendezvous = rdzv;
  opts.use_agent_store = true;
  opts.clock = &clock;
  opts.last_beat = [](const std::string&) -> std::optional<TimePoint> { return std::nullopt; };
  auto cfg = config(2, 0);
  cfg.hang_timeout = 10s;
  cfg.hang_timeout_from_start = true;  // the workers never beat
  Agent agent(cfg, procs, io, opts);
  ::testing::internal::CaptureStderr();
  const int code = agent.run();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, exit_codes::kWorkersFailed);
  EXPECT_NE(err.find("root cause of the hang: rank 2 on node 0 (a, local rank 2, pid 4242)"),
            std::string::npos)
      << err;
  const size_t report = err.rfind("Root cause");
  ASSERT_NE(report, std::string::npos) << err;
  EXPECT_NE(err.find("a rank stuck on another node", report), std::string::npos) << err;
  EXPECT_NE(err.find("Workers on this node (its victims", report), std::string::npos) << err;
  EXPECT_TRUE(rdzv->reports.empty()) << "the peer that asked told every node already";
}

TEST(AgentRendezvous, LocalFailureIsPushedToTheOtherNodes) {
  asio::io_context io;
  FakeProcessContext procs(io);
  auto rdzv = std::make_shared<FakeRendezvous>();
  procs.script = [](int64_t lr, int64_t) {
    return lr == 0 ? Behaviour{ExitStatus::exited(9)} : Behaviour{};
  };
  auto opts = options();
  opts.rendezvous = rdzv;
  Agent agent(config(2, 0), procs, io, opts);
  EXPECT_EQ(agent.run(), exit_codes::kWorkersFailed);
  ASSERT_EQ(rdzv->reports.size(), 1u);
  EXPECT_NE(rdzv->reports[0].find("rank 3"), std::string::npos) << rdzv->reports[0];
  EXPECT_NE(rdzv->reports[0].find("exit code 9"), std::string::npos) << rdzv->reports[0];
  EXPECT_TRUE(rdzv->closed);  // the budget is spent: no more rounds for anyone
}

// Workers that fail because a peer node died are node loss, not a worker failure: with the
// budget at 0 the agent asks the rendezvous for the verdict and re-forms for free.
TEST(AgentRendezvous, WorkerFailureSettledAsNodeLossIsAFreeRestart) {
  asio::io_context io;
  FakeProcessContext procs(io);
  auto rdzv = std::make_shared<FakeRendezvous>();
  rdzv->verdict = {FailureVerdict::Kind::kNodeLost, "node b (node rank 0) lost"};
  procs.script = [](int64_t lr, int64_t attempt) {
    if (attempt == 0) return lr == 0 ? Behaviour{ExitStatus::exited(1)} : Behaviour{};
    return Behaviour{ExitStatus::exited(0)};
  };
  auto opts = options();
  opts.rendezvous = rdzv;
  ::testing::internal::CaptureStderr();
  Agent agent(config(2, 0), procs, io, opts);
  int code = agent.run();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, exit_codes::kSuccess) << err;
  EXPECT_EQ(rdzv->settled, 1);
  EXPECT_EQ(agent.generations(), 2);
  EXPECT_EQ(agent.restarts_used(), 0);
  EXPECT_NE(err.find("node b (node rank 0) lost"), std::string::npos) << err;
  EXPECT_NE(err.find("not counted as a restart"), std::string::npos) << err;
}

// The job's store is gone: the agent stops its workers and fails with the handler's sentence,
// once, and does not ask for another round.
TEST(AgentRendezvous, StoreLostStopsTheWorkersAndFailsWithOneSentence) {
  asio::io_context io;
  FakeProcessContext procs(io);
  auto rdzv = std::make_shared<FakeRendezvous>();
  const std::string why = "the agent hosting the c10d store at 10.0.0.1:29400 is gone";
  procs.script = [&](int64_t lr, int64_t) {
    if (lr == 1) {
      std::thread([rdzv, why]() {
        rdzv->fire(RendezvousEvent::Kind::kStoreLost, why, false);
      }).detach();
    }
    return Behaviour{};  // run until stopped
  };
  auto opts = options();
  opts.rendezvous = rdzv;
  ::testing::internal::CaptureStderr();
  Agent agent(config(2, 3), procs, io, opts);
  int code = agent.run();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, exit_codes::kWorkersFailed) << err;
  EXPECT_EQ(rdzv->rounds(), 1);
  EXPECT_EQ(agent.restarts_used(), 0);
  size_t at = err.find(why);
  ASSERT_NE(at, std::string::npos) << err;
  EXPECT_EQ(err.find(why, at + 1), std::string::npos) << err;
}

// One node of a 2-node job whose round carries a shared store (so the agents run the exit
// barrier); shutdown() can be slow, as a watcher blocked in a store call is.
class SharedStoreRendezvous : public RendezvousHandler {
 public:
  SharedStoreRendezvous(std::shared_ptr<Store> store, int64_t rank, Duration shutdown_takes)
      : store_(std::move(store)), rank_(rank), shutdown_takes_(shutdown_takes) {}
  std::string backend() const override { return "shared"; }
  std::string run_id() const override { return "shared"; }
  RendezvousResult next_rendezvous() override {
    RendezvousResult r;
    r.group_rank = rank_;
    r.group_world_size = 2;
    r.local_world_sizes = {1, 1};
    r.hosts = {"a", "b"};
    r.master_addr = "127.0.0.1";
    r.master_port = 29400;
    r.store = store_;
    return r;
  }
  void watch(std::function<void(const RendezvousEvent&)>) override {}
  void request_restart(const std::string&) override {}
  int64_t num_nodes_waiting() override { return 0; }
  void set_closed() override {}
  bool is_closed() override { return false; }
  void shutdown() override {
    std::this_thread::sleep_for(shutdown_takes_);
    shut_down = true;
  }
  std::atomic<bool> shut_down{false};

 private:
  std::shared_ptr<Store> store_;
  int64_t rank_;
  Duration shutdown_takes_;
};

// Found at 1,024 agents (docs/benchmarks.md, "Agents at scale"): the agent hosting the store
// left as soon as the exit barrier opened, closing the store under the other agents' watchers,
// which then logged warnings and reconnected for up to 15 s before they could exit. The host
// now leaves only after every other node has stopped its rendezvous.
TEST(AgentRendezvous, TheStoreHostLeavesAfterTheOtherNodesStoppedTheirRendezvous) {
  auto store = std::make_shared<InMemoryStore>();
  auto host_rdzv = std::make_shared<SharedStoreRendezvous>(store, 0, 0ms);
  auto other_rdzv = std::make_shared<SharedStoreRendezvous>(store, 1, 300ms);
  auto run_node = [](std::shared_ptr<SharedStoreRendezvous> rdzv, bool hosts,
                     std::shared_ptr<SharedStoreRendezvous> peer, bool* peer_was_down) {
    asio::io_context io;
    FakeProcessContext procs(io);
    procs.script = [](int64_t, int64_t) { return Behaviour{ExitStatus::exited(0)}; };
    auto opts = options();
    opts.rendezvous = rdzv;
    opts.hosts_store = hosts;
    Agent agent(config(1, 0), procs, io, opts);
    int code = agent.run();
    *peer_was_down = peer->shut_down;
    return code;
  };
  bool other_down_when_host_left = false, host_down_when_other_left = false;
  auto host = std::async(std::launch::async, run_node, host_rdzv, true, other_rdzv,
                         &other_down_when_host_left);
  auto other = std::async(std::launch::async, run_node, other_rdzv, false, host_rdzv,
                          &host_down_when_other_left);
  EXPECT_EQ(host.get(), exit_codes::kSuccess);
  EXPECT_EQ(other.get(), exit_codes::kSuccess);
  EXPECT_TRUE(other_down_when_host_left)
      << "the store host left while another node's rendezvous was still running";
}

// A round that blocks until the test releases it, as a real rendezvous waiting for nodes does.
class BlockingRendezvous : public RendezvousHandler {
 public:
  std::string backend() const override { return "blocking"; }
  std::string run_id() const override { return "blocking"; }
  RendezvousResult next_rendezvous() override {
    std::unique_lock<std::mutex> lock(mutex_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
    if (fail) throw StateError("the round failed (test)");
    RendezvousResult r;
    r.group_world_size = 1;
    r.local_world_sizes = {1};
    r.hosts = {"a"};
    r.master_addr = "127.0.0.1";
    r.master_port = 29400;
    return r;
  }
  void watch(std::function<void(const RendezvousEvent&)>) override {}
  void request_restart(const std::string&) override {}
  int64_t num_nodes_waiting() override { return 0; }
  void set_closed() override {}
  bool is_closed() override { return false; }
  void shutdown() override {}
  void wait_entered() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return entered_; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    cv_.notify_all();
  }
  bool fail = false;  // next_rendezvous throws once released

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool entered_ = false;
  bool released_ = false;
};

// The agent is stopped and destroyed while its round still blocks; when the round ends later,
// the detached round thread must not touch the dead agent (ASan: heap-use-after-free).
TEST(AgentRendezvous, ARoundEndingAfterTheAgentIsGoneTouchesNothing) {
  auto rdzv = std::make_shared<BlockingRendezvous>();
  {
    asio::io_context io;
    FakeProcessContext procs(io);
    procs.script = [](int64_t, int64_t) { return Behaviour{ExitStatus::exited(0)}; };
    auto opts = options();
    opts.rendezvous = rdzv;
    Agent agent(config(1, 0), procs, io, opts);
    std::thread stopper([&]() {
      rdzv->wait_entered();
      io.stop();
    });
    agent.run();
    stopper.join();
  }
  rdzv->release();
  // The round thread holds the other reference until it has finished.
  for (int i = 0; i < 1000 && rdzv.use_count() > 1; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(rdzv.use_count(), 1);
}

// The directories of a generation's workers are made while its round forms, so that the
// mkdirs are not on the path from the round's end to the spawn (with 1,024 agents on one ext4,
// they were a tenth of the agents' CPU in that window). The workers get them.
class AttemptDirTest : public ::testing::Test {
 protected:
  // The run directories create_run_dir made under --log_dir that hold `attempt`.
  std::vector<std::string> with(const std::string& attempt) const {
    std::vector<std::string> found;
    for (const auto& run : std::filesystem::directory_iterator(base_)) {
      if (std::filesystem::exists(run.path() / attempt)) found.push_back(run.path() / attempt);
    }
    return found;
  }
  // Runs an agent of two workers that exit 0 with --log_dir base_; `during_round` runs while
  // its round blocks, which then completes (or fails, with `round_fails`). Returns the exit code.
  int run_agent(bool round_fails, const std::function<void()>& during_round) {
    auto rdzv = std::make_shared<BlockingRendezvous>();
    rdzv->fail = round_fails;
    asio::io_context io;
    FakeProcessContext procs(io);
    procs.script = [](int64_t, int64_t) { return Behaviour{ExitStatus::exited(0)}; };
    auto opts = options();
    opts.rendezvous = rdzv;
    LaunchConfig cfg = config(2, 0);
    cfg.log_dir = base_;
    Agent agent(cfg, procs, io, opts);
    std::thread round([&]() {
      rdzv->wait_entered();
      during_round();
      rdzv->release();
    });
    int code = agent.run();
    round.join();
    spawned_ = procs.spawned;
    return code;
  }
  dlaunch::testing::TempDir dir_;  // --log_dir
  const std::string& base_ = dir_.path();
  std::vector<SpawnRequest> spawned_;
};

TEST_F(AttemptDirTest, TheFirstAttemptsDirectoriesExistBeforeTheRoundEndsAndTheWorkersUseThem) {
  std::vector<std::string> during;
  EXPECT_EQ(run_agent(false, [&] { during = with("attempt_0/1"); }), exit_codes::kSuccess);
  ASSERT_EQ(during.size(), 1u) << "attempt_0/1 was not made while the round formed";
  ASSERT_EQ(spawned_.size(), 2u);
  EXPECT_EQ(env_of(spawned_[1], "TORCHELASTIC_ERROR_FILE"), during[0] + "/error.json");
}

TEST_F(AttemptDirTest, ARoundThatFailsLeavesNoEmptyAttemptInTheLogDir) {
  size_t during = 0;
  EXPECT_EQ(run_agent(true, [&] { during = with("attempt_0").size(); }),
            exit_codes::kWorkersFailed);
  EXPECT_EQ(during, 1u);
  EXPECT_TRUE(with("attempt_0").empty()) << "the prepared attempt_0 was left behind";
  EXPECT_TRUE(spawned_.empty());
}

}  // namespace
}  // namespace dlaunch
