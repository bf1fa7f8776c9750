// The agent's supervision logic against a fake process context: scripted exits, recorded
// signals, a FakeClock for the hang rule. Real processes are covered by the integration tests.
#include "launcher/agent.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <map>
#include <memory>

namespace dlaunch {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

struct Behaviour {
  std::optional<ExitStatus> exit;  // exits by itself after `after`; nullopt: runs until signaled
  Duration after = 1ms;
  bool ignore_sigterm = false;
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
    asio::post(io_, [this, pid, sig]() { end(pid, ExitStatus::killed(sig)); });
  }
  std::vector<std::string> kill_orphans(Duration) override { return {}; }
  void reap_orphan_zombies() override {}
  std::string process_state(int pid) override {
    auto it = procs_.find(pid);
    return it != procs_.end() && it->second.alive ? "S" : "";
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

}  // namespace
}  // namespace dlaunch
