#include "launcher/agent.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/worker_env.h"
#include "launcher/agent_decision.h"
#include "launcher/agent_monitor.h"
#include "launcher/exit_barrier.h"
#include "launcher/failure_report.h"
#include "launcher/hang_investigation.h"
#include "launcher/line_splitter.h"
#include "launcher/log_router.h"
#include "launcher/posix_process_context.h"
#include "launcher/python_hooks.h"
#include "launcher/run_dir.h"
#include "launcher/stack_capture.h"
#include "launcher/worker_group.h"
#include "rendezvous/handlers/rendezvous_handler.h"
#include "rendezvous/tcp/tcp_store_server.h"

extern char** environ;

namespace dlaunch {
namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

std::optional<TimePoint> mtime_on_steady_clock(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  auto mtime = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
  auto age = std::chrono::system_clock::now() - mtime;
  return std::chrono::steady_clock::now() -
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(age);
}

// A port nobody listens on right now (the same race torchrun accepts: it is handed to the
// workers, whose rank 0 binds it).
int64_t pick_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw SystemError(errno_message("socket", errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(fd);
    throw SystemError(errno_message("picking a free port", err));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

const char* rendezvous_event_name(RendezvousEvent::Kind kind) {
  switch (kind) {
    case RendezvousEvent::Kind::kMembershipChanged:
      return "membership_changed";
    case RendezvousEvent::Kind::kRestartRequested:
      return "restart_requested";
    case RendezvousEvent::Kind::kShutdownRequested:
      return "shutdown_requested";
    case RendezvousEvent::Kind::kStoreLost:
      return "store_lost";
  }
  return "rendezvous_event";
}

}  // namespace

std::vector<std::pair<std::string, std::string>> current_environment() {
  std::vector<std::pair<std::string, std::string>> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

struct Agent::Impl {
  enum class Phase { kRendezvous, kRunning, kCapturing, kStopping, kExitBarrier, kDone };

  Impl(LaunchConfig c, ProcessContext& p, asio::io_context& i, AgentOptions o)
      : gate(std::make_shared<PostGate>(i)),
        cfg(std::move(c)),
        procs(p),
        io(i),
        opts(std::move(o)),
        signals(i),
        grace_timer(i),
        kill_timer(i),
        hang_timer(i),
        hang_probe(p, i),
        output_timer(i) {
    if (!opts.last_beat) opts.last_beat = mtime_on_steady_clock;
  }

  // Helper threads (rendezvous round, exit barrier, the handler's watcher) post back through
  // this, so a thread still blocked when the agent is destroyed (stopped by a signal) never
  // touches a dead io_context. The gate, not the agent, knows the loop: such a thread must not
  // read any member of the (by then freed) Impl, not even the `io` reference.
  struct PostGate {
    explicit PostGate(asio::io_context& i) : io(i) {}
    std::mutex mutex;
    bool open = true;
    asio::io_context& io;  // used only while open
  };
  std::shared_ptr<PostGate> gate;
  template <typename F>
  static void post_from_thread(const std::shared_ptr<PostGate>& gate, F f) {
    std::lock_guard<std::mutex> lock(gate->mutex);
    if (gate->open) asio::post(gate->io, std::move(f));
  }

  LaunchConfig cfg;
  ProcessContext& procs;
  asio::io_context& io;
  AgentOptions opts;
  asio::signal_set signals;
  asio::steady_timer grace_timer;
  asio::steady_timer kill_timer;
  asio::steady_timer hang_timer;
  HangInvestigation hang_probe;  // hung workers' stacks and diagnosis (phase kCapturing)
  asio::steady_timer output_timer;
  bool output_timer_armed = false;
  std::set<std::weak_ptr<WorkerOutput>, std::owner_less<std::weak_ptr<WorkerOutput>>>
      outputs_with_tail;

  Phase phase = Phase::kRendezvous;
  // Why the agent stops the group, if the workers do not end on their own; decide() reads it
  // when the group is down (agent_decision.h).
  StopCause cause;
  int exit_code = 0;
  int64_t generation = -1;  // generations started (DLAUNCH_ATTEMPT)
  int64_t restarts_used = 0;
  TimePoint stop_started{};  // when the group (or what it left) was sent its stop signal
  bool exec_failure_logged = false;  // "cannot execute" is said once per job
  // The rendezvous declared the job's store gone: why, in one sentence (printed by decide()).
  std::string store_lost;
  // Exit barrier: every node is past it (stop_loop then says this node has left).
  bool passed_exit_barrier = false;
  // A failure's verdict is awaited from the rendezvous (settle_failure).
  bool settling = false;
  std::thread settle_thread;
  std::thread report_thread;  // publishes this node's failure (report_to_peers)
  // The workers exited 0 and what they left running is given --shutdown_grace (stop_leftovers).
  bool leftovers_pending = false;
  bool use_agent_store = false;
  const bool console_is_terminal = ::isatty(STDOUT_FILENO) == 1;
  std::string run_dir;
  bool temp_run_dir = false;
  bool keep_temp_run_dir = false;  // it holds redirected/teed output: never deleted
  std::string omp_threads;
  int64_t master_port = 0;
  std::unique_ptr<WorkerGroup> group;
  std::vector<std::shared_ptr<WorkerOutput>> outputs;
  std::vector<std::string> earlier_failures;
  std::vector<std::string> stuck;
  std::optional<RendezvousResult> last_round;
  std::thread rdzv_thread;
  // Timeline, status endpoint and control (agent_monitor.h); created by prepare().
  std::unique_ptr<AgentMonitor> monitor;
  std::chrono::system_clock::time_point started_wall = std::chrono::system_clock::now();

  // ---- setup ----------------------------------------------------------------------------------

  void prepare() {
    if (!cfg.log_dir.empty()) {
      // This run's own directory: never one another job (or an earlier run) writes into.
      RunDir dir = create_run_dir(cfg.log_dir, cfg.run_id, run_id_named_by_user(cfg));
      run_dir = dir.path;
      if (!dir.note.empty()) log_warning("{}", dir.note);
      log_info("worker logs go to {}", run_dir);
    } else {
      const char* tmp = std::getenv("TMPDIR");
      std::string templ =
          fmt::format("{}/dlaunch_{}_XXXXXX", tmp && *tmp ? tmp : "/tmp", cfg.run_id);
      std::vector<char> buf(templ.begin(), templ.end());
      buf.push_back('\0');
      if (!::mkdtemp(buf.data())) {
        throw SystemError(errno_message("cannot create a directory from " + templ, errno));
      }
      run_dir = buf.data();
      temp_run_dir = true;
      // -r/-t output exists only in these files: deleting them on success would lose it.
      for (int64_t lr = 0; lr < cfg.nproc_per_node; ++lr) {
        keep_temp_run_dir |= writes_file(cfg, lr, 1) || writes_file(cfg, lr, 2);
      }
      if (keep_temp_run_dir) {
        log_warning(
            "--redirects/--tee without --log_dir: the workers' output files go to {} "
            "and stay there after the job; give --log_dir to choose the place",
            run_dir);
      } else if (!procs.remove_on_agent_death(run_dir)) {
        // A failed job keeps it and says where (finish_now); an agent killed outright cannot
        // say, so the orphan guard removes it rather than leave litter in $TMPDIR.
        log_debug("the orphan guard cannot take {}: it stays if dlaunch is killed", run_dir);
      }
    }
    start_monitor();
    bool user_omp = false;
    for (const auto& [k, v] : opts.base_env) user_omp |= k == env_names::kOmpNumThreads;
    if (!user_omp) {
      int64_t n = std::max<int64_t>(1, opts.cpus / std::max<int64_t>(1, cfg.nproc_per_node));
      omp_threads = std::to_string(n);
      log_info("setting OMP_NUM_THREADS={} for each worker ({} cores / {} workers) to avoid "
               "overloading the node; set OMP_NUM_THREADS yourself to tune it",
               n, opts.cpus, cfg.nproc_per_node);
    }
    master_port = opts.master_port.value_or(cfg.master_port);
    use_agent_store = opts.use_agent_store;
    if (!opts.master_addr.empty()) cfg.master_addr = opts.master_addr;
    if (master_port == 0 && !opts.rendezvous) {
      master_port = pick_free_port();
      log_info("--master_port 0: workers will use port {}", master_port);
    }
    if (opts.handle_signals) {
      for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGCHLD}) {
        // A signal our caller ignored (nohup: SIGHUP) stays ignored, here and, as nothing
        // handles it, in the workers (spawn() resets only handled signals). SIGCHLD is ours.
        struct sigaction sa {};
        if (s != SIGCHLD && sigaction(s, nullptr, &sa) == 0 && !(sa.sa_flags & SA_SIGINFO) &&
            sa.sa_handler == SIG_IGN) {
          log_info(
              "{} is ignored (as the caller, e.g. nohup, set it): dlaunch and its workers "
              "keep ignoring it",
              signal_name(s));
          continue;
        }
        signals.add(s);
      }
      wait_signal();
    }
  }

  // ---- timeline, status endpoint, control (agent_monitor.h) -----------------------------------

  void start_monitor() {
    MonitorOptions m = monitor_options(cfg, opts);
    monitor = std::make_unique<AgentMonitor>(procs, io, m);
    monitor->open_timeline(run_dir);
    if (opts.store_server) {
      monitor->events().emit("store_hosted",
                             {{"address", fmt::format("{}:{}", opts.store_server->host(),
                                                      opts.store_server->port())}});
    }
    MonitorHooks hooks;
    hooks.snapshot = [this]() { return status_now(); };
    hooks.control = [this](ControlAction a, const std::string& who) { return on_control(a, who); };
    monitor->start_endpoint(std::move(hooks));
    if (!opts.rendezvous && opts.store_server) monitor->publish_local(*opts.store_server);
  }

  static const char* phase_name(Phase p) {
    switch (p) {
      case Phase::kRendezvous:
        return "rendezvous";
      case Phase::kRunning:
        return "running";
      case Phase::kCapturing:
        return "capturing_stacks";
      case Phase::kStopping:
        return "stopping";
      case Phase::kExitBarrier:
        return "exit_barrier";
      case Phase::kDone:
        return "done";
    }
    return "?";
  }

  NodeStatus status_now() const {
    NodeStatus s;
    s.run_id = cfg.run_id;
    s.host = opts.host;
    s.agent_pid = static_cast<int>(::getpid());
    s.phase = phase_name(phase);
    s.attempt = generation;
    s.max_restarts = cfg.max_restarts;
    s.restarts = last_round ? last_round->restart_count : restarts_used;
    if (last_round) {
      s.round = last_round->round;
      s.node_rank = last_round->group_rank;
      s.nnodes = last_round->group_world_size;
      for (int64_t n : last_round->local_world_sizes) s.world_size += n;
    }
    s.agent_start_time = std::chrono::duration<double>(started_wall.time_since_epoch()).count();
    s.events_file = monitor->events().path();
    s.agent_usage = read_proc_usage(s.agent_pid);
    if (group) {
      TimePoint now = opts.clock->now();
      for (const auto& w : group->workers()) {
        s.workers.push_back(worker_status(w, s.restarts, now, opts.last_beat(w.heartbeat_file)));
      }
    }
    if (opts.store_server) s.store = opts.store_server->stats();
    return s;
  }

  // `dlaunch stop` takes the SIGTERM path; `dlaunch restart` the path of a failure elsewhere,
  // so it is counted against --max_restarts and refused when none is left (docs/cli.md).
  ControlAnswer on_control(ControlAction action, const std::string& who) {
    if (action == ControlAction::kStop) {
      if (phase == Phase::kDone) return {409, opts.host + ": the job is already over"};
      log_warning("stop requested by {}", who);
      // After the answer is on its way: stopping may end the loop at once (no worker left, a
      // rendezvous round pending), and then the answer would never be written.
      asio::post(io, [this]() { on_signal(SIGTERM); });
      return {200, fmt::format("{}: stopping (as on SIGTERM; dlaunch exits {})", opts.host,
                               exit_codes::kSignalBase + SIGTERM)};
    }
    if (phase != Phase::kRunning && phase != Phase::kCapturing) {
      return {409, fmt::format("{}: not restarting: the workers are not running (phase {})",
                               opts.host, phase_name(phase))};
    }
    int64_t used = last_round ? last_round->restart_count : restarts_used;
    if (used >= cfg.max_restarts) {
      return {409, fmt::format("{}: not restarting: the restart budget is spent ({} of "
                               "--max_restarts {}); a restart would end the job",
                               opts.host, used, cfg.max_restarts)};
    }
    std::string reason = "restart requested by " + who;
    log_warning("{}; restarting the worker group (counted against --max_restarts)", reason);
    group->on_stop_requested(reason);
    cause.record(StopKind::kPeerRestart);
    if (opts.rendezvous) report_to_peers(reason);
    phase = Phase::kRunning;  // a capture in progress is abandoned
    stop_group(SIGTERM);
    return {200, fmt::format("{}: restarting the worker groups job-wide ({} of {} restarts)",
                             opts.host, used + 1, cfg.max_restarts)};
  }

  // ---- generations ----------------------------------------------------------------------------

  void begin_generation() {
    phase = Phase::kRendezvous;
    if (!opts.rendezvous) {
      RendezvousResult r;
      r.round = generation + 1;
      r.group_rank = 0;
      r.group_world_size = 1;
      r.local_world_sizes = {cfg.nproc_per_node};
      r.hosts = {opts.host};
      r.master_addr = cfg.master_addr;
      r.master_port = master_port;
      r.restart_count = restarts_used;
      start_workers(r);
      return;
    }
    // next_rendezvous() blocks: run it off the loop, then come back to spawn on the loop thread.
    monitor->events().emit("rendezvous_opened", {{"restarts", restarts_used}});
    if (rdzv_thread.joinable()) rdzv_thread.join();
    auto handler = opts.rendezvous;
    auto g = gate;
    rdzv_thread = std::thread([this, handler, g]() {
      try {
        RendezvousResult r = handler->next_rendezvous();
        post_from_thread(g, [this, r]() { on_rendezvous_done(r); });
      } catch (const std::exception& e) {
        std::string msg = e.what();
        post_from_thread(g, [this, msg]() { on_rendezvous_failed(msg); });
      }
    });
  }

  void on_rendezvous_done(const RendezvousResult& r) {
    if (phase == Phase::kDone) return;
    monitor->events().emit("rendezvous_closed", {{"round", r.round},
                                                 {"node_rank", r.group_rank},
                                                 {"nodes", r.group_world_size},
                                                 {"members", r.hosts},
                                                 {"restart_count", r.restart_count}});
    monitor->publish([store = r.store]() { return store; });
    auto g = gate;
    opts.rendezvous->watch([this, g](const RendezvousEvent& ev) {
      post_from_thread(g, [this, ev]() { on_rendezvous_event(ev); });
    });
    start_workers(r);
  }

  void on_rendezvous_failed(const std::string& msg) {
    if (phase == Phase::kDone) return;
    log_error("rendezvous failed: {}", msg);
    monitor->events().emit("rendezvous_failed", {{"error", msg}});
    finish(exit_codes::kWorkersFailed);
  }

  void on_rendezvous_event(const RendezvousEvent& ev) {
    monitor->events().emit(rendezvous_event_name(ev.kind), {{"reason", ev.reason}});
    if (ev.kind == RendezvousEvent::Kind::kStoreLost) return on_store_lost(ev.reason);
    if (phase == Phase::kExitBarrier) return on_event_after_success(ev);
    if (phase != Phase::kRunning && phase != Phase::kCapturing) return;
    switch (ev.kind) {
      case RendezvousEvent::Kind::kMembershipChanged:
        log_warning("membership changed: {}; restarting the workers (not counted as a restart)",
                    ev.reason);
        cause.record(StopKind::kMembershipChange);
        group->on_stop_requested("membership changed: " + ev.reason);
        stop_group(SIGTERM);
        break;
      case RendezvousEvent::Kind::kRestartRequested:
        log_warning("another node asked for a restart: {}", ev.reason);
        group->on_stop_requested("restart requested by another node: " + ev.reason);
        cause.record(StopKind::kPeerRestart);
        stop_group(SIGTERM);
        break;
      case RendezvousEvent::Kind::kShutdownRequested:
        log_info("the job is shutting down: {}", ev.reason);
        group->on_stop_requested("shutdown requested: " + ev.reason);
        cause.record(StopKind::kPeerShutdown);
        stop_group(SIGTERM);
        break;
      case RendezvousEvent::Kind::kStoreLost:
        break;  // on_store_lost
    }
  }

  // The job's store is gone (c10d: the agent hosting it died): no round can form again, so stop
  // the workers and exit with the handler's sentence. In the rendezvous phase the round itself
  // fails with that sentence; while a failure is being settled, the verdict carries it.
  void on_store_lost(const std::string& reason) {
    if (phase == Phase::kDone || !store_lost.empty()) return;
    store_lost = reason;
    cause.record(StopKind::kStoreLost);
    if (phase == Phase::kExitBarrier) {
      log_error("{}", reason);
      return finish_now(exit_codes::kWorkersFailed);
    }
    if (phase == Phase::kRunning || phase == Phase::kCapturing) {
      group->on_stop_requested(reason);
      stop_group(SIGTERM);
    }
  }

  // Our workers are done, others' are not: a failure elsewhere restarts everyone (the job-wide
  // budget permitting), a closed rendezvous means the job failed elsewhere.
  void on_event_after_success(const RendezvousEvent& ev) {
    if (ev.kind == RendezvousEvent::Kind::kRestartRequested) {
      // A node lost makes the others' workers fail: that rejoin is free (settle_failure).
      return settle_failure([this, ev](const FailureVerdict& v) {
        if (v.kind == FailureVerdict::Kind::kNodeLost) {
          log_warning("{}; rejoining the remaining nodes (not counted as a restart)", v.reason);
          return begin_generation();
        }
        rejoin_after_success(ev);
      });
    }
    if (ev.kind == RendezvousEvent::Kind::kShutdownRequested) {
      log_error("the job was closed by another node while this node waited: {}", ev.reason);
      return finish_now(exit_codes::kWorkersFailed);
    }
  }

  void rejoin_after_success(const RendezvousEvent& ev) {
    int64_t restart_count = last_round ? last_round->restart_count : restarts_used;
    if (restart_count < cfg.max_restarts) {
      log_warning("another node failed after this node's workers finished ({}); rejoining "
                  "for the job-wide restart",
                  ev.reason);
      ++restarts_used;
      earlier_failures.push_back(fmt::format("attempt {}: {}", group->attempt(), ev.reason));
      return begin_generation();
    }
    log_error("another node failed ({}) and the restart budget ({}) is spent", ev.reason,
              cfg.max_restarts);
    finish_now(exit_codes::kWorkersFailed);
  }

  // ---- failure verdict ------------------------------------------------------------------------

  // Asks the rendezvous whether the round's failure spends the budget or a node was lost
  // (RendezvousHandler::settle_failure, up to the keep-alive window) on a helper thread, then
  // continues on the loop with `then`; a store lost meanwhile ends the job, a signal too
  // (on_signal). Only one at a time: the next starts after this one posted back.
  void settle_failure(std::function<void(const FailureVerdict&)> then) {
    if (settle_thread.joinable()) settle_thread.join();
    settling = true;
    auto handler = opts.rendezvous;
    auto g = gate;
    const int64_t gen = generation;
    std::thread report = std::move(report_thread);
    settle_thread = std::thread([this, handler, g, gen, then,
                                 report = std::move(report)]() mutable {
      if (report.joinable()) report.join();  // this node's own failure is published first
      FailureVerdict v;
      try {
        v = handler->settle_failure();
      } catch (const std::exception& e) {
        log_warning("could not find out whether a node was lost ({}); counting the failure",
                    e.what());
      }
      post_from_thread(g, [this, gen, v, then]() {
        if (gen != generation || phase == Phase::kDone || !settling) return;
        settling = false;
        if (cause.is(StopKind::kPreempted) && phase != Phase::kExitBarrier) {
          return decide();  // exits 75
        }
        if (v.kind == FailureVerdict::Kind::kStoreLost) {
          store_lost = v.reason;
          cause.record(StopKind::kStoreLost);
          log_error("{}", v.reason);
          return finish(exit_codes::kWorkersFailed);
        }
        then(v);
      });
    });
  }

  WorkerEnv worker_env(const RendezvousResult& r, int64_t local_rank, int64_t base,
                       int64_t world, const std::string& rank_dir) const {
    WorkerEnv e;
    e.local_rank = local_rank;
    e.rank = base + local_rank;
    e.world_size = world;
    e.local_world_size = cfg.nproc_per_node;
    e.group_rank = r.group_rank;
    e.group_world_size = r.group_world_size;
    e.role_rank = e.rank;  // one role per job: role ranks are the global ranks
    e.role_world_size = world;
    e.role_name = cfg.role;
    e.master_addr = r.master_addr;
    e.master_port = r.master_port;
    e.restart_count = r.restart_count;
    e.max_restarts = cfg.max_restarts;
    e.run_id = cfg.run_id;
    e.use_agent_store = use_agent_store;
    e.error_file = rank_dir + "/error.json";
    e.omp_num_threads = omp_threads;
    e.heartbeat_file = rank_dir + "/heartbeat";
    e.node_id = opts.host;
    e.attempt = generation;
    // Progress bars draw only on a terminal; through dlaunch the worker's stdout is a pipe, so
    // say whether its lines end up on one.
    e.console_tty = console_is_terminal && cfg.console_shows(local_rank, 1);
    e.flash_dir = opts.flash_dir;
    return e;
  }

  std::vector<std::pair<std::string, std::string>> full_env(const WorkerEnv& e) const {
    auto contract = e.to_env();
    std::vector<std::pair<std::string, std::string>> env;
    env.reserve(opts.base_env.size() + contract.size() + 1);
    bool has_nccl_async = false;
    for (const auto& kv : opts.base_env) {
      bool overridden = std::any_of(contract.begin(), contract.end(),
                                    [&](const auto& c) { return c.first == kv.first; });
      if (!overridden) env.push_back(kv);
      has_nccl_async |= kv.first == env_names::kNcclAsyncErrorHandling;
    }
    env.insert(env.end(), contract.begin(), contract.end());
    // torchrun 1.13's agent sets it unless the user did, so NCCL errors abort instead of hang.
    if (!has_nccl_async) env.emplace_back(env_names::kNcclAsyncErrorHandling, "1");
    return env;
  }

  void start_workers(const RendezvousResult& r) {
    ++generation;
    last_round = r;
    cause.new_generation();
    int64_t base = 0, world = 0;
    for (size_t i = 0; i < r.local_world_sizes.size(); ++i) {
      if (static_cast<int64_t>(i) < r.group_rank) base += r.local_world_sizes[i];
      world += r.local_world_sizes[i];
    }
    if (world == 0) world = cfg.nproc_per_node;
    std::string attempt_dir = fmt::format("{}/attempt_{}", run_dir, generation);
    std::error_code ec;
    // Never replace an attempt directory. The run directory is this run's own (prepare()), so
    // one that exists was written by someone else: stop rather than delete or mix into it.
    if (!fs::create_directory(attempt_dir, ec)) {
      std::string why = ec ? ec.message()
                           : "it already exists (another process writes into " + run_dir + ")";
      log_error("cannot create {}: {}; not replacing it: give this job its own --log_dir (or "
                "--rdzv_id)",
                attempt_dir, why);
      finish(exit_codes::kWorkersFailed);
      return;
    }
    std::vector<WorkerRecord> records;
    for (int64_t lr = 0; lr < cfg.nproc_per_node; ++lr) {
      WorkerRecord w;
      w.local_rank = lr;
      w.global_rank = base + lr;
      w.log_dir = fmt::format("{}/{}", attempt_dir, lr);
      fs::create_directories(w.log_dir, ec);
      if (ec) {
        log_error("cannot create {}: {}", w.log_dir, ec.message());
        finish(exit_codes::kWorkersFailed);
        return;
      }
      w.error_file = w.log_dir + "/error.json";
      w.heartbeat_file = w.log_dir + "/heartbeat";
      records.push_back(std::move(w));
    }
    group = std::make_unique<WorkerGroup>(generation, std::move(records));
    outputs.assign(static_cast<size_t>(cfg.nproc_per_node), nullptr);
    log_info("attempt {}: starting {} worker(s), global ranks {}-{} of {} (node {} of {}), "
             "restart count {}/{}",
             generation, cfg.nproc_per_node, base, base + cfg.nproc_per_node - 1, world,
             r.group_rank, r.group_world_size, r.restart_count, cfg.max_restarts);
    phase = Phase::kRunning;
    const int64_t gen = generation;
    auto console = make_shared_console(cfg);  // --log_fold
    for (int64_t lr = 0; lr < cfg.nproc_per_node; ++lr) {
      WorkerRecord& w = group->worker(lr);
      SpawnRequest req;
      req.argv = cfg.worker_argv(lr);
      req.env = full_env(worker_env(r, lr, base, world, w.log_dir));
      if (!cfg.no_python_hooks && !opts.python_hooks_dir.empty()) {
        add_python_hooks_env(req.env, opts.python_hooks_dir, w.log_dir + "/py_stack.txt");
      }
      try {
        auto out = std::make_shared<WorkerOutput>(cfg, lr, w.log_dir, console);
        outputs[static_cast<size_t>(lr)] = out;
        auto tail = std::make_shared<LineSplitter>();
        auto add_tail = [this, gen, lr](std::string_view line) {
          if (gen == generation && group) group->add_stderr_line(lr, std::string(line));
        };
        ProcessCallbacks cb;
        cb.on_output = [this, out, tail, add_tail](int stream, std::string_view bytes) {
          out->write(stream, bytes, opts.clock->now());
          if (stream == 2) tail->feed(bytes, add_tail);
          if (out->next_due()) watch_partial_line(out);
        };
        cb.on_exit = [this, gen, lr, out, tail, add_tail](const ExitStatus& st) {
          out->finish();
          if (out->next_due()) watch_partial_line(out);  // lines held by --log_fold
          tail->flush(add_tail);
          on_worker_exit(gen, lr, st);
        };
        cb.on_exec_failed = [this, gen, lr](const std::string& message) {
          on_exec_failed(gen, lr, message);
        };
        int pid = procs.spawn(req, std::move(cb));
        group->on_started(lr, pid, opts.clock->now(), std::chrono::system_clock::now());
        monitor->events().emit(
            "worker_started",
            {{"rank", w.global_rank}, {"local_rank", lr}, {"pid", pid}, {"attempt", generation}});
        log_debug("local rank {} started as pid {}", lr, pid);
      } catch (const SpawnError& e) {
        log_spawn_error(e.what());
        cause.record(StopKind::kUsage);
        group->on_spawn_failed(e.what());
        stop_group(SIGTERM);
        return;
      } catch (const Error& e) {
        log_error("cannot start local rank {}: {}", lr, e.what());
        group->on_spawn_failed(e.what());
        stop_group(SIGTERM);
        return;
      }
    }
    if (cfg.hang_timeout.count() > 0) arm_hang_check();
  }

  // A worker's unterminated console line (a prompt, a progress bar) shows once it has waited
  // kPartialLineDelay; one timer serves every worker, armed only while a tail waits.
  void watch_partial_line(const std::shared_ptr<WorkerOutput>& out) {
    outputs_with_tail.insert(out);
    if (!output_timer_armed) arm_output_timer();
  }

  void arm_output_timer() {
    std::optional<TimePoint> due;
    for (auto it = outputs_with_tail.begin(); it != outputs_with_tail.end();) {
      auto out = it->lock();
      auto next = out ? out->next_due() : std::nullopt;
      if (!next) {
        it = outputs_with_tail.erase(it);
        continue;
      }
      if (!due || *next < *due) due = next;
      ++it;
    }
    output_timer_armed = due.has_value();
    if (!due) return;
    output_timer.expires_after(
        std::max<Duration>(*due - opts.clock->now(), std::chrono::milliseconds(1)));
    output_timer.async_wait([this](const boost::system::error_code& ec) {
      output_timer_armed = false;
      if (ec) return;
      TimePoint now = opts.clock->now();
      for (const auto& weak : outputs_with_tail) {
        if (auto out = weak.lock()) out->flush_due(now);
      }
      arm_output_timer();
    });
  }

  // ---- supervision ----------------------------------------------------------------------------

  void on_worker_exit(int64_t gen, int64_t lr, const ExitStatus& st) {
    if (gen != generation || !group) return;  // an abandoned worker of an earlier generation
    bool was_final = group->final();
    group->on_exit(lr, st, opts.clock->now(), std::chrono::system_clock::now());
    const WorkerRecord& w = group->worker(lr);
    monitor->events().emit("worker_exited",
                           {{"rank", w.global_rank},
                            {"local_rank", lr},
                            {"pid", w.pid},
                            st.signaled ? EventFields::value_type{"signal", signal_name(st.code)}
                                        : EventFields::value_type{"exit_code", st.code},
                            {"attempt", generation}});
    if (!was_final && group->state() == GroupState::kFailed) {
      log_error("local rank {} (rank {}, pid {}) failed: {}; stopping the other workers", lr,
                w.global_rank, w.pid, st.describe());
      if (opts.rendezvous) {
        report_to_peers(fmt::format("rank {} on {} failed: {}", w.global_rank, opts.host,
                                    st.describe()));
      }
      stop_group(SIGTERM);
      return;
    }
    log_debug("local rank {} (pid {}) exited: {}", lr, w.pid, st.describe());
    if (group->state() == GroupState::kSucceeded && phase == Phase::kRunning) {
      // After a preemption notice a worker that checkpointed and exited 0 (dtrain) finished
      // nothing: say what happened; decide() reports the preemption.
      if (cause.is(StopKind::kPreempted)) {
        log_info("all {} worker(s) stopped cleanly after the preemption notice",
                 cfg.nproc_per_node);
      } else {
        log_info("all {} worker(s) finished successfully", cfg.nproc_per_node);
      }
      phase = Phase::kStopping;
      stop_leftovers();
      return;
    }
    if (phase == Phase::kStopping && group->all_exited()) group_stopped();
  }

  // The program was found but could not be executed: a usage problem, no restart helps.
  void on_exec_failed(int64_t gen, int64_t lr, const std::string& message) {
    if (gen != generation || !group) return;
    cause.record(StopKind::kUsage);
    if (!exec_failure_logged) {
      exec_failure_logged = true;
      log_spawn_error(message);
    }
    bool was_final = group->final();
    group->on_exit(lr, ExitStatus::exited(127), opts.clock->now(), std::chrono::system_clock::now());
    if (!was_final) {
      stop_group(SIGTERM);
    } else if (phase == Phase::kStopping && group->all_exited()) {
      group_stopped();
    }
  }

  void log_spawn_error(const std::string& message) {
    if (cfg.runs_python()) {
      log_error("{} (the interpreter for .py programs and -m; choose it with --python, e.g. "
                "--python /usr/bin/python3 for Debian's PyTorch)",
                message);
    } else {
      log_error("{}", message);
    }
  }

  // Publishes the failure for the other nodes on a helper thread: against a store host that is
  // cut off (not dead) the call waits for its reply timeout, and the loop must stay free for
  // signals meanwhile. The failure's settle waits for it (settle_failure).
  void report_to_peers(const std::string& report) {
    if (!store_lost.empty()) return;  // nobody to tell; the sentence is printed once, in decide()
    if (report_thread.joinable()) report_thread.detach();  // an earlier one, long done
    auto handler = opts.rendezvous;
    report_thread = std::thread([handler, report]() {
      try {
        handler->request_restart(report);
      } catch (const std::exception& e) {
        log_warning("could not tell the other nodes about the failure: {}", e.what());
      }
    });
  }

  void arm_hang_check() {
    // At most 500 ms: a hang is seen within --hang_timeout + 0.5 s, also for long timeouts.
    Duration period = std::clamp<Duration>(cfg.hang_timeout / 4, std::chrono::milliseconds(10),
                                           std::chrono::milliseconds(500));
    hang_timer.expires_after(period);
    const int64_t gen = generation;
    hang_timer.async_wait([this, gen](const boost::system::error_code& ec) {
      if (ec || gen != generation || phase != Phase::kRunning) return;
      check_hangs();
      if (phase == Phase::kRunning) arm_hang_check();
    });
  }

  void check_hangs() {
    TimePoint now = opts.clock->now();
    // Suspects: silent for half the timeout. The rank that got stuck and the ranks that then
    // block in a collective go silent within a step of each other, in either order, so the
    // stuck one may not be over the timeout yet when its first victim is.
    std::vector<int64_t> hung, suspects;
    for (auto& w : group->workers()) {
      if (!w.running()) continue;
      auto beat = opts.last_beat(w.heartbeat_file);
      bool from_start = cfg.hang_timeout_from_start;
      if (WorkerGroup::is_hung(w.started, beat, now, cfg.hang_timeout, from_start)) {
        hung.push_back(w.local_rank);
      } else if (WorkerGroup::is_hung(w.started, beat, now, cfg.hang_timeout / 2, from_start)) {
        suspects.push_back(w.local_rank);
      }
    }
    if (hung.empty()) return;
    // The hung first: without stacks to tell, the first hung one is named.
    suspects.insert(suspects.begin(), hung.begin(), hung.end());
    // The first by index stands as the root cause until the stacks tell who is stuck and who
    // waits for it in a collective (investigate_hang).
    group->on_hung(hung.front(), now, std::chrono::system_clock::now());
    for (int64_t lr : hung) {
      const WorkerRecord& w = group->worker(lr);
      monitor->events().emit("hang_detected",
                             {{"rank", w.global_rank},
                              {"local_rank", w.local_rank},
                              {"pid", w.pid},
                              {"hang_timeout_seconds", to_seconds(cfg.hang_timeout)}});
      log_error("local rank {} (rank {}, pid {}) is hung: its heartbeat file {} was not touched "
                "for more than {:.1f} s (--hang_timeout)",
                w.local_rank, w.global_rank, w.pid, w.heartbeat_file,
                to_seconds(cfg.hang_timeout));
    }
    investigate_hang(suspects);
  }

  // ---- stacks and diagnosis of hung workers (hang_investigation.h) ---------------------------

  void investigate_hang(const std::vector<int64_t>& suspects) {
    if (!opts.capture_stacks) return blame_hang(suspects, {});
    HangInvestigation::Options o;
    for (const auto& [k, v] : opts.base_env) {
      if (k == "PATH") o.path_env = v;
    }
    if (o.path_env.empty()) o.path_env = "/usr/local/bin:/usr/bin:/bin";
    o.env = opts.base_env;
    o.timeout = opts.stack_capture_timeout;
    if (stack_capture_command(0, o.path_env).empty()) {
      log_warning("no native stacks of the hung workers: neither eu-stack (elfutils) nor gdb is "
                  "installed; install one of them to get stacks (see docs/troubleshooting.md)");
    }
    // Every silent worker, victims too: their stacks show what they wait for. Workers that still
    // beat are not part of the hang (and each native capture takes a while: gdb, seconds).
    std::vector<HangInvestigation::Target> targets;
    for (int64_t lr : suspects) {
      const WorkerRecord& w = group->worker(lr);
      targets.push_back({w.local_rank, w.global_rank, w.pid, w.log_dir});
    }
    phase = Phase::kCapturing;
    const int64_t gen = generation;
    hang_probe.start(std::move(targets), std::move(o),
                     [this, gen, suspects](std::vector<HangInvestigation::Result> results) {
                       if (gen != generation || phase != Phase::kCapturing) return;
                       blame_hang(suspects, results);
                     });
  }

  // Names the silent rank that is stuck outside a collective as the root cause (judge_hang),
  // tells the other nodes and stops the group.
  void blame_hang(const std::vector<int64_t>& suspects,
                  const std::vector<HangInvestigation::Result>& results) {
    HangVerdict v = judge_hang(suspects, results);
    for (const auto& r : results) {
      WorkerRecord& w = group->worker(r.target.local_rank);
      w.hang_where = r.finding.where;
      w.python_stack = r.finding.python_stack;
    }
    for (const auto& line : v.log) log_error("{}", line);
    group->blame_hang(v.root);
    const WorkerRecord& w = group->worker(v.root);
    if (opts.rendezvous) {
      report_to_peers(fmt::format("rank {} on {} hung (no heartbeat for {:.1f} s){}{}",
                                  w.global_rank, opts.host, to_seconds(cfg.hang_timeout),
                                  w.hang_where.empty() ? "" : " in ", w.hang_where));
    }
    kill_silent_workers();
    stop_group(SIGTERM);
  }

  // Workers silent for longer than --hang_timeout get SIGKILL at once, before the others'
  // SIGTERM: stuck (or stopped) they cannot act on SIGTERM, their stacks are already taken, and
  // waiting --shutdown_grace for them only delays the restart. Their peers, blocked in a
  // collective with them, then fail at once as the sockets close.
  void kill_silent_workers() {
    const TimePoint now = opts.clock->now();
    for (auto& w : group->workers()) {
      if (!w.running() || w.pid <= 0) continue;
      auto beat = opts.last_beat(w.heartbeat_file);
      if (w.hung || WorkerGroup::is_hung(w.started, beat, now, cfg.hang_timeout,
                                         cfg.hang_timeout_from_start)) {
        procs.signal_group(w.pid, SIGKILL);
      }
    }
  }

  // ---- stopping -------------------------------------------------------------------------------

  // Sends `first` to every running worker's group, then SIGKILL after --shutdown_grace.
  void stop_group(int first) {
    if (phase == Phase::kStopping || phase == Phase::kDone) return;
    phase = Phase::kStopping;
    hang_timer.cancel();
    if (group->all_exited()) {
      group_stopped();
      return;
    }
    stop_started = opts.clock->now();
    for (auto& w : group->workers()) {
      if (w.running()) procs.signal_group(w.pid, first);
    }
    grace_timer.expires_after(cfg.shutdown_grace);
    const int64_t gen = generation;
    grace_timer.async_wait([this, gen](const boost::system::error_code& ec) {
      if (!ec && gen == generation && phase == Phase::kStopping) kill_now();
    });
  }

  // Every worker exited 0 but left processes running (an uploader started with Popen, a
  // daemon). torchrun lets them run on as orphans; dlaunch leaves no orphan, but it does not
  // kill them unannounced either: SIGTERM, up to --shutdown_grace to end, then SIGKILL, each
  // step logged at warning level with what it hits.
  void stop_leftovers() {
    // Signal 0: pinned and watched, not signalled yet. What ends within the grace was never
    // touched (an uploader finishing its upload), as torchrun, which does not wait at all,
    // would have let it finish.
    std::vector<std::string> left = procs.signal_leftovers(0, on_leftovers_gone());
    if (left.empty()) {
      group_stopped();
      return;
    }
    leftovers_pending = true;
    stop_started = opts.clock->now();
    log_warning("the workers exited 0 but left {} process(es) running: {}; letting them finish "
                "for up to {:.1f} s (--shutdown_grace), then SIGTERM, then SIGKILL",
                left.size(), join(left), to_seconds(cfg.shutdown_grace));
    const int64_t gen = generation;
    grace_timer.expires_after(cfg.shutdown_grace);
    grace_timer.async_wait([this, gen](const boost::system::error_code& ec) {
      if (!ec && gen == generation && phase == Phase::kStopping) term_leftovers();
    });
  }

  void term_leftovers() {
    std::vector<std::string> left = procs.signal_leftovers(SIGTERM, on_leftovers_gone());
    if (left.empty()) return kill_leftovers();
    log_warning("{} process(es) the workers left still run {:.1f} s after the workers exited: "
                "{}; sending SIGTERM, SIGKILL in {:.1f} s (let the workers wait for them, or "
                "raise --shutdown_grace)",
                left.size(), to_seconds(opts.clock->now() - stop_started), join(left),
                to_seconds(opts.kill_wait));
    const int64_t gen = generation;
    grace_timer.expires_after(opts.kill_wait);
    grace_timer.async_wait([this, gen](const boost::system::error_code& ec) {
      if (!ec && gen == generation && phase == Phase::kStopping) kill_leftovers();
    });
  }

  std::function<void()> on_leftovers_gone() {
    const int64_t gen = generation;
    return [this, gen]() {
      if (gen != generation || phase != Phase::kStopping || !leftovers_pending) return;
      leftovers_pending = false;
      grace_timer.cancel();
      log_info("the processes the workers left have ended");
      group_stopped();
    };
  }

  void kill_leftovers() {
    grace_timer.cancel();
    leftovers_pending = false;
    std::vector<std::string> left = procs.live_leftovers();
    if (!left.empty()) {
      log_warning("{} process(es) the workers left still run {:.1f} s after the workers exited: "
                  "{}; sending SIGKILL",
                  left.size(), to_seconds(opts.clock->now() - stop_started), join(left));
    }
    group_stopped();
  }

  static std::string join(const std::vector<std::string>& items) {
    std::string out;
    for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
    return out;
  }

  void kill_now() {
    if (leftovers_pending) return kill_leftovers();
    grace_timer.cancel();
    // The real time since the stop signal: the grace when it ran out, less after a second
    // Ctrl-C.
    const double elapsed = to_seconds(opts.clock->now() - stop_started);
    for (auto& w : group->workers()) {
      if (!w.running()) continue;
      log_warning("local rank {} (pid {}) still runs {:.1f} s after the stop signal; sending "
                  "SIGKILL",
                  w.local_rank, w.pid, elapsed);
      procs.signal_group(w.pid, SIGKILL);
    }
    kill_timer.expires_after(opts.kill_wait);
    const int64_t gen = generation;
    kill_timer.async_wait([this, gen](const boost::system::error_code& ec) {
      if (ec || gen != generation || phase != Phase::kStopping) return;
      for (auto& w : group->workers()) {
        if (!w.running()) continue;
        std::string state = procs.process_state(w.pid);
        log_error("local rank {} (pid {}) did not die {:.1f} s after SIGKILL (state {}{}); not "
                  "waiting for it",
                  w.local_rank, w.pid, to_seconds(opts.kill_wait), state.empty() ? "?" : state,
                  state == "D" ? ": uninterruptible sleep, usually a stuck device or file system"
                               : "");
        stuck.push_back(fmt::format("pid {} (local rank {}, state {})", w.pid, w.local_rank,
                                    state.empty() ? "?" : state));
        group->on_abandoned(w.local_rank);
      }
      group_stopped();
    });
  }

  void group_stopped() {
    if (phase == Phase::kDone) return;
    grace_timer.cancel();
    kill_timer.cancel();
    hang_timer.cancel();
    // Children left in the workers' groups, then anything reparented to us.
    for (auto& w : group->workers()) {
      if (w.pid > 0 && !w.abandoned) procs.signal_group(w.pid, SIGKILL);
    }
    for (auto& s : procs.kill_orphans(opts.kill_wait)) {
      log_error("orphaned process {} did not die after SIGKILL; not waiting for it", s);
      stuck.push_back(s);
    }
    decide();
  }

  // The group is down: what next is agent_decision.h's decide(); this carries it out.
  void decide() {
    DecisionInput in;
    in.group = group->state();
    in.cause = cause;
    in.restarts_used = last_round ? last_round->restart_count : restarts_used;
    in.max_restarts = cfg.max_restarts;
    in.multi_node = opts.rendezvous != nullptr;
    act(in, dlaunch::decide(in));
  }

  // `node_lost`: the rendezvous's sentence when its verdict was a lost node.
  void act(const DecisionInput& in, const Decision& d, const std::string& node_lost = {}) {
    switch (d.action) {
      case Decision::Action::kFinish:
        say_why_finished(in, d);
        if (d.report) report_failure(in.restarts_used);
        return finish(d.exit_code);
      case Decision::Action::kRestart:
        if (d.counted) return restart_counted(in.restarts_used);
        return restart_free(node_lost);
      case Decision::Action::kRejoin:
        return begin_generation();
      case Decision::Action::kSettle:
        // The verdict completes the input as it was when the group went down: events that
        // arrive while it is awaited (a store lost) concern the next round, as they always did.
        return settle_failure([this, in](const FailureVerdict& v) {
          DecisionInput with_verdict = in;
          with_verdict.verdict = v.kind == FailureVerdict::Kind::kNodeLost
                                     ? FailureVerdictInput::kNodeLost
                                     : FailureVerdictInput::kCounted;
          act(with_verdict, dlaunch::decide(with_verdict), v.reason);
        });
    }
  }

  void say_why_finished(const DecisionInput& in, const Decision& d) {
    if (in.cause.is(StopKind::kPreempted)) {
      log_warning("the job was preempted (SIGUSR1) and its workers have stopped; exiting with "
                  "{} so the scheduler requeues it",
                  exit_codes::kPreempted);
    } else if (in.cause.is(StopKind::kSignal)) {
      log_warning("stopped by {}; exiting with {}", signal_name(in.cause.signal), d.exit_code);
    } else if (d.exit_code == exit_codes::kWorkersFailed && in.cause.is(StopKind::kStoreLost)) {
      log_error("{}", store_lost);
    } else if (d.exit_code == exit_codes::kWorkersFailed &&
               in.cause.is(StopKind::kPeerShutdown)) {
      log_error("another node closed the job ({}); stopping here too", group->stop_reason());
    }
  }

  // A peer node died under this round (settle_failure): a new round with the rest, free.
  void restart_free(const std::string& reason) {
    monitor->events().emit("restart", {{"counted", false}, {"why", reason}});
    log_warning("{}; re-forming with the remaining nodes (not counted as a restart)", reason);
    earlier_failures.push_back(
        fmt::format("attempt {}: {} (free restart)", group->attempt(), reason));
    begin_generation();
  }

  // The failure spends the budget, which lasts (decide()).
  void restart_counted(int64_t restart_count) {
    ++restarts_used;
    if (auto root = group->root_cause()) {
      const WorkerRecord& w = group->worker(*root);
      earlier_failures.push_back(
          fmt::format("attempt {}: {}", group->attempt(), describe_end(w, cfg.hang_timeout)));
    } else {
      earlier_failures.push_back(
          fmt::format("attempt {}: {}", group->attempt(), group->stop_reason()));
    }
    log_warning("restarting the worker group ({} of {} restarts)", restart_count + 1,
                cfg.max_restarts);
    monitor->events().emit("restart", {{"counted", true},
                                       {"restart", restart_count + 1},
                                       {"max_restarts", cfg.max_restarts},
                                       {"why", earlier_failures.back()}});
    begin_generation();
  }

  // The failure spends the budget, which is spent: the report, and the root cause for a parent
  // launcher.
  void report_failure(int64_t restart_count) {
    if (!group->root_cause() && group->stop_reason().empty()) return;
    ReportContext ctx;
    ctx.host = opts.host;
    ctx.version = opts.version;
    ctx.max_restarts = cfg.max_restarts;
    ctx.restarts_used = restart_count;
    ctx.hang_timeout = cfg.hang_timeout;
    ctx.earlier = earlier_failures;
    ctx.stuck = stuck;
    ctx.events_file = monitor->events().path();
    std::string report = format_failure_report(*group, ctx);
    ssize_t ignored = ::write(STDERR_FILENO, report.data(), report.size());
    (void)ignored;
    propagate_error_file();
  }

  // When dlaunch itself runs under a launcher that gave it TORCHELASTIC_ERROR_FILE (torchrun,
  // another dlaunch), hand the root cause up as torchrun's agent does: the worker's error file
  // as is, else a file in the same format saying how the worker ended.
  void propagate_error_file() {
    std::string target;
    for (const auto& [k, v] : opts.base_env) {
      if (k == env_names::kErrorFile) target = v;
    }
    auto root = group->root_cause();
    if (target.empty() || !root) return;
    const WorkerRecord& w = group->worker(*root);
    std::ifstream in(w.error_file);
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (content.empty()) {
      nlohmann::json j;
      j["message"]["message"] =
          fmt::format("dlaunch: rank {} on {} {}", w.global_rank, opts.host,
                      describe_end(w, cfg.hang_timeout));
      j["message"]["extraInfo"]["timestamp"] = std::to_string(
          std::chrono::duration_cast<std::chrono::seconds>(w.exited_wall.time_since_epoch())
              .count());
      content = j.dump();
    }
    std::ofstream out(target);
    out << content;
    if (!out) log_warning("could not write the error file {} for the parent launcher", target);
  }

  void finish(int code) {
    if (phase == Phase::kDone) return;
    grace_timer.cancel();
    kill_timer.cancel();
    hang_timer.cancel();
    hang_probe.cancel();
    if (code == exit_codes::kSuccess && opts.rendezvous && last_round && last_round->store &&
        last_round->group_world_size > 1) {
      return start_exit_barrier();
    }
    finish_now(code);
  }

  // This node's workers succeeded; wait until every node's did (torchrun's exit barrier), so
  // the agent hosting the store does not take it away while others still use it, and so a
  // failure elsewhere still brings this node back for the job-wide restart.
  void start_exit_barrier() {
    phase = Phase::kExitBarrier;
    auto store = last_round->store;
    int64_t nodes = last_round->group_world_size;
    int64_t round = last_round->round;
    log_info("waiting for the other {} node(s) to finish (up to {:.0f} s)", nodes - 1,
             to_seconds(kExitBarrierTimeout));
    auto g = gate;
    const int64_t gen = generation;
    std::thread([this, store, nodes, round, g, gen]() {
      bool ok = true;
      try {
        wait_exit_barrier(*store, round, nodes);
      } catch (const std::exception& e) {
        ok = false;
        log_warning("not every node reached the exit barrier: {}", e.what());
      }
      post_from_thread(g, [this, gen, ok]() {
        if (gen != generation || phase != Phase::kExitBarrier) return;
        passed_exit_barrier = ok;
        finish_now(ok ? exit_codes::kSuccess : exit_codes::kWorkersFailed);
      });
    }).detach();
  }

  void finish_now(int code) {
    if (phase == Phase::kDone) return;
    phase = Phase::kDone;
    exit_code = code;
    monitor->events().emit("job_finished", {{"exit_code", code}, {"restarts", restarts_used}});
    if (temp_run_dir) {
      // Kept when it may explain something (error files, stacks); not for success or a program
      // that never started.
      if (keep_temp_run_dir && code != exit_codes::kUsage) {
        log_info("worker output files (--redirects/--tee) are kept in {}", run_dir);
      } else if (code == exit_codes::kSuccess || code == exit_codes::kUsage) {
        std::error_code ec;
        fs::remove_all(run_dir, ec);
      } else {
        log_info("worker files (error files, heartbeats, stacks) are kept in {}", run_dir);
      }
    }
    if (opts.rendezvous && (code == exit_codes::kWorkersFailed || code == exit_codes::kUsage)) {
      // The job failed for good (or cannot run here at all): no more rounds for anyone.
      try {
        opts.rendezvous->set_closed();
      } catch (const std::exception& e) {
        log_warning("closing the rendezvous: {}", e.what());
      }
    }
    stop_loop();
  }

  // The agent cannot go on (an unexpected error escaped a handler): nothing may outlive it.
  void emergency_stop() {
    try {
      if (group) {
        for (auto& w : group->workers()) {
          if (w.pid > 0) procs.signal_group(w.pid, SIGKILL);
        }
      }
      procs.kill_orphans(opts.kill_wait);
    } catch (const std::exception& e) {
      log_error("emergency stop: {}", e.what());
    }
  }

  void stop_loop() {
    if (opts.rendezvous) {
      try {
        opts.rendezvous->shutdown();
      } catch (const std::exception& e) {
        log_warning("leaving the rendezvous: {}", e.what());
      }
      // Blocks the loop thread, which is ending anyway (exit_barrier.h says how long).
      if (passed_exit_barrier) {
        leave_exit_barrier(*last_round->store, last_round->round, last_round->group_world_size,
                           opts.hosts_store);
      }
    }
    monitor->stop();
    boost::system::error_code ignored;
    signals.cancel(ignored);
    io.stop();
  }

  // ---- signals --------------------------------------------------------------------------------

  void wait_signal() {
    signals.async_wait([this](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      on_signal(sig);
      wait_signal();
    });
  }

  void forward(int sig) {
    if (!group) return;
    for (auto& w : group->workers()) {
      if (w.running()) procs.signal_group(w.pid, sig);
    }
  }

  void on_signal(int sig) {
    if (sig == SIGCHLD) {
      procs.reap_orphan_zombies();
      return;
    }
    if (phase == Phase::kDone) return;
    monitor->events().emit("signal_received", {{"signal", signal_name(sig)}});
    if (phase == Phase::kExitBarrier) {
      // Only the exit barrier is left: a terminating signal ends the wait.
      if (sig != SIGUSR1 && sig != SIGUSR2) finish_now(exit_codes::kSignalBase + sig);
      return;
    }
    if (settling && sig != SIGUSR1 && sig != SIGUSR2) {
      // The workers are stopped and only a failure's verdict is awaited: do not wait for it.
      cause.record_signal(sig);
      settling = false;
      log_warning("received {} while settling a failure; stopping", signal_name(sig));
      return finish_now(exit_codes::kSignalBase + sig);
    }
    if (sig == SIGUSR1 || sig == SIGUSR2) {
      log_info("received {}; forwarding it to every worker", signal_name(sig));
      forward(sig);
      if (sig == SIGUSR1 && !cause.is(StopKind::kPreempted)) {
        cause.record(StopKind::kPreempted);
        log_warning("SIGUSR1 is the preemption notice: when the workers stop, dlaunch exits "
                    "with {} (requeue) and does not restart them",
                    exit_codes::kPreempted);
      }
      return;
    }
    if (cause.signal != 0 && phase == Phase::kStopping) {
      log_warning("received {} again {:.1f} s after the stop signal; killing the workers now",
                  signal_name(sig), to_seconds(opts.clock->now() - stop_started));
      kill_now();
      return;
    }
    cause.record_signal(sig);
    log_warning("received {}; forwarding it to every worker and stopping the job",
                signal_name(sig));
    switch (phase) {
      case Phase::kRendezvous:
        finish(exit_codes::kSignalBase + sig);
        return;
      case Phase::kRunning:
      case Phase::kCapturing:
        group->on_stop_requested(fmt::format("dlaunch received {}", signal_name(sig)));
        phase = Phase::kRunning;  // a capture in progress is abandoned
        stop_group(sig);
        return;
      case Phase::kStopping:
        forward(sig);
        return;
      case Phase::kExitBarrier:
      case Phase::kDone:
        return;
    }
  }
};

Agent::Agent(LaunchConfig cfg, ProcessContext& procs, asio::io_context& io, AgentOptions opts)
    : impl_(std::make_unique<Impl>(std::move(cfg), procs, io, std::move(opts))) {}

Agent::~Agent() {
  {
    std::lock_guard<std::mutex> lock(impl_->gate->mutex);
    impl_->gate->open = false;
  }
  if (impl_->rdzv_thread.joinable()) {
    // A round still blocked in next_rendezvous (the agent was stopped during it). It holds its
    // own reference to the handler and can no longer post (the gate is closed).
    impl_->rdzv_thread.detach();
  }
  // Likewise a failure verdict still awaited (bounded by the keep-alive window) and a failure
  // report still on its way.
  if (impl_->settle_thread.joinable()) impl_->settle_thread.detach();
  if (impl_->report_thread.joinable()) impl_->report_thread.detach();
}

int Agent::run() {
  try {
    // The loop must not run dry while a helper thread (rendezvous round, exit barrier) works:
    // only finish() ends it, with io.stop().
    auto work = asio::make_work_guard(impl_->io);
    impl_->prepare();
    impl_->begin_generation();
    impl_->io.run();
  } catch (const UsageError& e) {
    log_error("{}", e.what());
    impl_->emergency_stop();
    return exit_codes::kUsage;
  } catch (const std::exception& e) {
    log_error("{}", e.what());
    impl_->emergency_stop();
    return exit_codes::kWorkersFailed;
  }
  return impl_->exit_code;
}

int64_t Agent::restarts_used() const { return impl_->restarts_used; }
int64_t Agent::generations() const { return impl_->generation + 1; }

}  // namespace dlaunch
