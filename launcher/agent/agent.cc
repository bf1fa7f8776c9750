#include "launcher/agent/agent.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <cerrno>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "launcher/agent/agent_core.h"
#include "launcher/agent/exit_barrier.h"
#include "launcher/agent/failure_report.h"
#include "launcher/hang/heartbeat_file.h"
#include "launcher/agent/parent_error_file.h"

extern char** environ;

namespace dlaunch {
namespace asio = boost::asio;

namespace {

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

const char* agent_phase_name(AgentPhase p) {
  switch (p) {
    case AgentPhase::kRendezvous:
      return "rendezvous";
    case AgentPhase::kRunning:
      return "running";
    case AgentPhase::kCapturing:
      return "capturing_stacks";
    case AgentPhase::kStopping:
      return "stopping";
    case AgentPhase::kExitBarrier:
      return "exit_barrier";
    case AgentPhase::kDone:
      return "done";
  }
  return "?";
}

AgentCore::AgentCore(LaunchConfig c, ProcessContext& p, asio::io_context& i, AgentOptions o)
    : gate(std::make_shared<PostGate>(i)),
      cfg(std::move(c)),
      procs(p),
      io(i),
      opts(std::move(o)),
      rendezvous(*this),
      workers(*this),
      hangs(*this),
      stopper(*this),
      signals(*this),
      status(*this) {
  if (!opts.last_beat) opts.last_beat = last_heartbeat;
}

// ---- setup --------------------------------------------------------------------------------------

void AgentCore::prepare() {
  files.open(cfg, procs);
  status.start_monitor();
  workers.prepare();
  master_port = opts.master_port.value_or(cfg.master_port);
  if (!opts.master_addr.empty()) cfg.master_addr = opts.master_addr;
  if (master_port == 0 && !opts.rendezvous) {
    master_port = pick_free_port();
    log_info("--master_port 0: workers will use port {}", master_port);
  }
  if (opts.handle_signals) signals.install();
}

// ---- stopping and deciding ----------------------------------------------------------------------

void AgentCore::stop_group(int first) {
  if (phase == AgentPhase::kStopping || phase == AgentPhase::kDone) return;
  phase = AgentPhase::kStopping;
  hangs.stop_checks();
  if (group->all_exited()) return group_stopped();
  stopper.stop(first);
}

void AgentCore::group_stopped() {
  if (phase == AgentPhase::kDone) return;
  stopper.cancel();
  hangs.stop_checks();
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

void AgentCore::decide() {
  DecisionInput in;
  in.group = group->state();
  in.cause = cause;
  in.restarts_used = restart_count();
  in.max_restarts = cfg.max_restarts;
  in.multi_node = opts.rendezvous != nullptr;
  act(in, dlaunch::decide(in));
}

void AgentCore::act(const DecisionInput& in, const Decision& d, const std::string& node_lost) {
  switch (d.action) {
    case Decision::Action::kFinish:
      say_why_finished(in, d);
      if (d.report) report_failure(in.restarts_used);
      return finish(d.exit_code);
    case Decision::Action::kRestart:
      if (d.counted) return restart_counted(in.restarts_used);
      return restart_free(node_lost);
    case Decision::Action::kRejoin:
      return rendezvous.begin_generation();
    case Decision::Action::kSettle:
      // The verdict completes the input as it was when the group went down: events that
      // arrive while it is awaited (a store lost) concern the next round, as they always did.
      return rendezvous.settle_failure([this, in](const FailureVerdict& v) {
        DecisionInput with_verdict = in;
        with_verdict.verdict = v.kind == FailureVerdict::Kind::kNodeLost
                                   ? FailureVerdictInput::kNodeLost
                                   : FailureVerdictInput::kCounted;
        act(with_verdict, dlaunch::decide(with_verdict), v.reason);
      });
  }
}

void AgentCore::say_why_finished(const DecisionInput& in, const Decision& d) {
  if (in.cause.is(StopKind::kPreempted)) {
    log_warning("the job was preempted (SIGUSR1) and its workers have stopped; exiting with "
                "{} so the scheduler requeues it",
                exit_codes::kPreempted);
  } else if (in.cause.is(StopKind::kSignal)) {
    log_warning("stopped by {}; exiting with {}", signal_name(in.cause.signal), d.exit_code);
  } else if (d.exit_code == exit_codes::kWorkersFailed && in.cause.is(StopKind::kStoreLost)) {
    log_error("{}", store_lost);
  } else if (d.exit_code == exit_codes::kWorkersFailed && in.cause.is(StopKind::kPeerShutdown)) {
    log_error("another node closed the job ({}); stopping here too", group->stop_reason());
  }
}

// A peer node died under this round (settle_failure): a new round with the rest, free.
void AgentCore::restart_free(const std::string& reason) {
  monitor->events().emit("restart", {{"counted", false}, {"why", reason}});
  log_warning("{}; re-forming with the remaining nodes (not counted as a restart)", reason);
  earlier_failures.push_back(
      fmt::format("attempt {}: {} (free restart)", group->attempt(), reason));
  rendezvous.begin_generation();
}

// The failure spends the budget, which lasts (decide()).
void AgentCore::restart_counted(int64_t restart_count) {
  ++restarts_used;
  if (stuck_elsewhere) {
    earlier_failures.push_back(fmt::format("attempt {}: hung waiting for {}", group->attempt(),
                                           describe_remote_hang_root(*stuck_elsewhere)));
  } else if (auto root = group->root_cause()) {
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
  rendezvous.begin_generation();
}

// The failure spends the budget, which is spent: the report, and the root cause for a parent
// launcher.
void AgentCore::report_failure(int64_t restart_count) {
  if (!group->root_cause() && group->stop_reason().empty()) return;
  ReportContext ctx;
  ctx.host = opts.host;
  ctx.local_addr = cfg.local_addr;
  if (last_round && last_round->group_world_size > 1) ctx.node_rank = last_round->group_rank;
  ctx.version = opts.version;
  ctx.max_restarts = cfg.max_restarts;
  ctx.restarts_used = restart_count;
  ctx.hang_timeout = cfg.hang_timeout;
  ctx.earlier = earlier_failures;
  ctx.stuck = stuck;
  ctx.events_file = monitor->events().path();
  ctx.stuck_elsewhere = stuck_elsewhere;
  std::string report = format_failure_report(*group, ctx);
  ssize_t ignored = ::write(STDERR_FILENO, report.data(), report.size());
  (void)ignored;
  write_parent_error_file(*group, opts.base_env, opts.host, cfg.hang_timeout);
}

// ---- the end ------------------------------------------------------------------------------------

void AgentCore::finish(int code) {
  if (phase == AgentPhase::kDone) return;
  stopper.cancel();
  hangs.cancel();
  if (code == exit_codes::kSuccess && opts.rendezvous && last_round && last_round->store &&
      last_round->group_world_size > 1) {
    return start_exit_barrier();
  }
  finish_now(code);
}

// This node's workers succeeded; wait until every node's did (torchrun's exit barrier), so the
// agent hosting the store does not take it away while others still use it, and so a failure
// elsewhere still brings this node back for the job-wide restart.
void AgentCore::start_exit_barrier() {
  phase = AgentPhase::kExitBarrier;
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
      if (gen != generation || phase != AgentPhase::kExitBarrier) return;
      passed_exit_barrier = ok;
      finish_now(ok ? exit_codes::kSuccess : exit_codes::kWorkersFailed);
    });
  }).detach();
}

void AgentCore::finish_now(int code) {
  if (phase == AgentPhase::kDone) return;
  phase = AgentPhase::kDone;
  exit_code = code;
  monitor->events().emit("job_finished", {{"exit_code", code}, {"restarts", restarts_used}});
  workers.report_output_losses();
  files.close(code);
  if (opts.rendezvous && (code == exit_codes::kWorkersFailed || code == exit_codes::kUsage ||
                          code == exit_codes::kNodeMismatch)) {
    // The job failed for good (or cannot run here at all): no more rounds for anyone.
    try {
      opts.rendezvous->set_closed();
    } catch (const std::exception& e) {
      log_warning("closing the rendezvous: {}", e.what());
    }
  }
  stop_loop();
}

void AgentCore::emergency_stop() {
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

void AgentCore::stop_loop() {
  if (opts.rendezvous) {
    // Before the store can go: nodes waiting for a place learn that the job is over.
    if (passed_exit_barrier) opts.rendezvous->mark_finished();
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
  signals.cancel();
  io.stop();
}

// ---- Agent ---------------------------------------------------------------------------------------

struct Agent::Impl : AgentCore {
  using AgentCore::AgentCore;
};

Agent::Agent(LaunchConfig cfg, ProcessContext& procs, asio::io_context& io, AgentOptions opts)
    : impl_(std::make_unique<Impl>(std::move(cfg), procs, io, std::move(opts))) {}

Agent::~Agent() {
  impl_->gate->close();
  impl_->rendezvous.detach_threads();
}

int Agent::run() {
  try {
    // The loop must not run dry while a helper thread (rendezvous round, exit barrier) works:
    // only finish() ends it, with io.stop().
    auto work = asio::make_work_guard(impl_->io);
    impl_->prepare();
    impl_->rendezvous.begin_generation();
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
