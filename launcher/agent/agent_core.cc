#include "launcher/agent/agent_core.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "launcher/agent/exit_barrier.h"
#include "launcher/agent/failure_report.h"
#include "launcher/agent/parent_error_file.h"
#include "launcher/hang/heartbeat_file.h"

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

AgentCore::AgentCore(LaunchConfig c, ProcessContext& p, asio::io_context& i, AgentOptions o)
    : AgentContext(std::move(c), p, i, std::move(o)),
      rendezvous_(*this),
      workers_(*this),
      hangs_(*this),
      stopper_(*this),
      signals_(*this),
      status_(*this) {
  if (!opts.last_beat) opts.last_beat = last_heartbeat;
  state_.max_restarts = cfg.max_restarts;
  state_.multi_node = opts.rendezvous != nullptr;
  state_.hang_checks = cfg.hang_timeout.count() > 0;
  // Replacing one rank needs a store the agent can reach before the workers do, to announce it
  // in: an agent's store (workers that host their own have none).
  state_.rank_recovery = cfg.restart_scope == "rank" && opts.use_agent_store;
}

// ---- setup --------------------------------------------------------------------------------------

void AgentCore::prepare() {
  files.open(cfg, procs);
  status_.start_monitor();
  workers_.prepare();
  master_port = opts.master_port.value_or(cfg.master_port);
  if (!opts.master_addr.empty()) cfg.master_addr = opts.master_addr;
  if (master_port == 0 && !opts.rendezvous) {
    master_port = pick_free_port();
    log_info("--master_port 0: workers will use port {}", master_port);
  }
  if (opts.handle_signals) signals_.install();
}

// ---- the one place of decision ------------------------------------------------------------------

std::vector<Action> AgentCore::post(const Event& e) {
  StepResult r = step(state_, e);
  state_ = std::move(r.state);
  for (const Action& a : r.actions) carry_out(a);
  return std::move(r.actions);
}

void AgentCore::carry_out(const Action& a) {
  using A = Action::Kind;
  switch (a.kind) {
    case A::kBeginGeneration:
      return rendezvous_.begin_generation();
    case A::kStartWorkers:
      return workers_.start();
    case A::kArmHangChecks:
      return hangs_.arm();
    case A::kStopRequested:
      if (group) group->on_stop_requested(a.text);
      return;
    case A::kStopGroup:
      return stop_group(a.signal);
    case A::kStopLeftovers:
      return stopper_.stop_leftovers();
    case A::kKillNow:
      log_warning("received {} again {:.1f} s after the stop signal; killing the workers now",
                  signal_name(a.signal), to_seconds(opts.clock->now() - stopper_.stop_started()));
      return stopper_.kill_now();
    case A::kForward:
      return signals_.forward(a.signal);
    case A::kBeginLeaving:
      opts.rendezvous->begin_leaving();
      return;
    case A::kReportToPeers:
      return rendezvous_.report_to_peers(a.text);
    case A::kInvestigateForPeer:
      if (!hangs_.investigate_for_peer()) post({Event::Kind::kNothingToInvestigate});
      return;
    case A::kSettle:
      return rendezvous_.settle_failure();
    case A::kCollectGroup:
      return collect_group();
    case A::kSayWhyFinished:
      return say_why_finished(a);
    case A::kReportFailure:
      return report_failure(a.count);
    case A::kRecordRestart:
      return record_restart(a);
    case A::kRecordPeerFailure:
      earlier_failures.push_back(fmt::format("attempt {}: {}", group->attempt(), a.text));
      return;
    case A::kCancelTimers:
      stopper_.cancel();
      hangs_.cancel();
      return;
    case A::kStartExitBarrier:
      return start_exit_barrier();
    case A::kFinishNow:
      return finish_now(a.code);
    case A::kPauseHangChecks:
      return hangs_.pause();
    case A::kResumeHangChecks:
      return hangs_.resumed(opts.clock->now());
    case A::kStopSelf:
      ::kill(::getpid(), SIGSTOP);
      return;
    case A::kReapOrphans:
      procs.reap_orphan_zombies();
      return;
    case A::kSignalLater:
      asio::post(io, [this, sig = a.signal, by = a.text]() {
        Event e{Event::Kind::kSignal};
        e.signal = sig;
        e.text = by;
        post(e);
      });
      return;
    case A::kReplaceRank:
    case A::kAnnounceRestart:
      if (a.kind == A::kReplaceRank) hangs_.rank_replaced();
      return a.kind == A::kReplaceRank ? replace_rank(a) : announce_restart();
    case A::kRendezvousKeepingWorkers:
      return rendezvous_keeping_workers();
    case A::kShrink:
      return shrink(a);
    case A::kForgiveHang:
      group->forgive_hang();
      stuck_elsewhere.reset();
      return hangs_.resumed(opts.clock->now());
    case A::kTimeline:
    case A::kLogInfo:
    case A::kLogWarning:
    case A::kLogError:
    case A::kAnswer:
      return say(a);
  }
}

void AgentCore::say(const Action& a) {
  switch (a.kind) {
    case Action::Kind::kTimeline:
      monitor->events().emit(a.text, {{"signal", signal_name(a.signal)}});
      return;
    case Action::Kind::kLogInfo:
      log_info("{}", a.text);
      return;
    case Action::Kind::kLogWarning:
      log_warning("{}", a.text);
      return;
    case Action::Kind::kLogError:
      log_error("{}", a.text);
      return;
    default:
      return;  // kAnswer: the caller of post() reads it
  }
}

// ---- stopping -----------------------------------------------------------------------------------

void AgentCore::stop_group(int first) {
  hangs_.stop_checks();
  if (group->all_exited()) {
    Event down{Event::Kind::kGroupDown};
    down.group = group->state();
    post(down);
    return;
  }
  hangs_.kill_silent_workers();
  stopper_.stop(first);
}

// ---- rank recovery -----------------------------------------------------------------------------

// step() replaces the worker alone: its record is marked (the supervisor starts the replacement
// at its exit, or now if it has exited); a hung one is killed first, its stacks taken already.
void AgentCore::replace_rank(const Action& a) {
  const int64_t local_rank = a.count;
  const WorkerRecord& w = group->worker(local_rank);
  log_warning("{}", a.text);
  monitor->events().emit("rank_replaced", {{"rank", w.global_rank},
                                           {"local_rank", local_rank},
                                           {"pid", w.pid},
                                           {"hung", a.flag},
                                           {"restart", a.code},
                                           {"max_restarts", cfg.max_restarts},
                                           {"attempt", group->attempt()}});
  if (!group->begin_replacement(local_rank)) {
    log_warning("local rank {} can no longer be replaced alone (the group is {})", local_rank,
                group_state_name(group->state()));
    return;
  }
  if (a.flag) {
    // The survivors were blocked in a collective with it and now re-form: their silence so far
    // is not a hang of theirs.
    hangs_.resumed(opts.clock->now());
    procs.signal_group(w.pid, SIGKILL);
  }
}

// The group is being stopped: survivors waiting for a replacement exit at once. Said once per
// group, and only to workers that announced rank_recovery (no one else reads it).
void AgentCore::announce_restart() {
  if (!group || !recovery.on() || recovery.restart_announced() || !any_announced(*group)) return;
  try {
    recovery.announce(kRestartVerdict);
  } catch (const std::exception& e) {
    log_warning("cannot tell the workers in the store that the group restarts ({}); those "
                "waiting for a replacement exit at their join timeout or the stop signal",
                e.what());
  }
}

// ---- in-process shrink --------------------------------------------------------------------------

// A node was lost and the workers here wait for the verdict: the generation they last saw is
// read first (the next round's release empties their namespace, the counter with it), which
// also ties the agent's connection to their namespace.
void AgentCore::rendezvous_keeping_workers() {
  generation_before_shrink.reset();
  try {
    generation_before_shrink = recovery.current_generation();
  } catch (const std::exception& e) {
    log_warning("cannot read the workers' generation counter {} in the job's store ({}); the "
                "group restarts in the new round instead of shrinking in place",
                recovery.key(), e.what());
  }
  rendezvous_.begin_keeping_workers();
}

// The round holds exactly the nodes that kept their workers: the new round's node 0 announces
// the shrink, every node tells its own workers their new ranks, and the group, /status and the
// report use them from now on. The workers' environment stays as at their spawn.
void AgentCore::shrink(const Action& a) {
  const RendezvousResult& r = *last_round;
  const WorkerPlacement place = place_workers(r, cfg.nproc_per_node);
  std::vector<std::pair<int64_t, int64_t>> ranks;
  for (const WorkerRecord& w : group->workers()) {
    ranks.emplace_back(w.global_rank, place.first_rank + w.local_rank);
  }
  int64_t generation = -1;
  try {
    if (r.group_rank == 0) {
      generation = recovery.announce_shrink(generation_before_shrink.value_or(0), place.world,
                                            r.round);
    }
    recovery.tell_new_ranks(r.round, ranks);
  } catch (const std::exception& e) {
    log_error("cannot tell the workers their ranks after the shrink in the job's store at {}:{} "
              "({}); stopping them",
              r.master_addr, r.master_port, e.what());
    group->on_stop_requested("the shrink could not be announced: " + std::string(e.what()));
    Event failed{Event::Kind::kWorkerFailed};
    failed.text = fmt::format("the workers on {} could not be told their ranks after the shrink",
                              opts.host);
    post(failed);
    return;
  }
  const int64_t old_first = group->worker(0).global_rank;
  workers_.shrank();
  log_warning("{}: the group re-forms in process at world size {} (this node's ranks {}-{} are "
              "now {}-{}, node {} of {}; not counted as a restart)",
              a.text, place.world, old_first, old_first + cfg.nproc_per_node - 1,
              place.first_rank, place.first_rank + cfg.nproc_per_node - 1, r.group_rank,
              r.group_world_size);
  earlier_failures.push_back(fmt::format("attempt {}: {} (the group shrank in process to world "
                                         "size {})",
                                         group->attempt(), a.text, place.world));
  monitor->events().emit("shrink", {{"world_size", place.world},
                                    {"round", r.round},
                                    {"node_rank", r.group_rank},
                                    {"nodes", r.group_world_size},
                                    {"first_rank", place.first_rank},
                                    {"generation", generation},
                                    {"attempt", group->attempt()},
                                    {"why", a.text}});
}

// The group and what it left are down: kill what remains in its process groups, then anything
// reparented to us.
void AgentCore::collect_group() {
  stopper_.cancel();
  hangs_.stop_checks();
  for (auto& w : group->workers()) {
    if (w.pid > 0 && !w.abandoned) procs.signal_group(w.pid, SIGKILL);
  }
  for (auto& s : procs.kill_orphans(opts.kill_wait)) {
    log_error("orphaned process {} did not die after SIGKILL; not waiting for it", s);
    stuck.push_back(s);
  }
}

void AgentCore::say_why_finished(const Action& a) {
  const auto cause = static_cast<StopKind>(a.count);
  if (cause == StopKind::kPreempted) {
    log_warning(
        "the job was preempted (SIGUSR1) and its workers have stopped; exiting with "
        "{} so the scheduler requeues it",
        exit_codes::kPreempted);
  } else if (cause == StopKind::kSignal) {
    log_warning("stopped by {}; exiting with {}", signal_name(a.signal), a.code);
  } else if (a.code == exit_codes::kWorkersFailed && cause == StopKind::kStoreLost) {
    log_error("{}", state_.store_lost);
  } else if (a.code == exit_codes::kWorkersFailed && cause == StopKind::kPeerShutdown) {
    log_error("another node closed the job ({}); stopping here too", group->stop_reason());
  }
}

void AgentCore::record_restart(const Action& a) {
  if (!a.flag) {
    // A peer node died under this round (settle_failure): a new round with the rest, free.
    monitor->events().emit("restart", {{"counted", false}, {"why", a.text}});
    log_warning("{}; re-forming with the remaining nodes (not counted as a restart)", a.text);
    earlier_failures.push_back(
        fmt::format("attempt {}: {} (free restart)", group->attempt(), a.text));
    return;
  }
  // The failure spends the budget, which lasts.
  const int64_t restart_count = a.count;
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
  ctx.hang_timeout_auto = cfg.hang_timeout_auto;
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

// This node's workers succeeded; wait until every node's did (torchrun's exit barrier), so the
// agent hosting the store does not take it away while others still use it, and so a failure
// elsewhere still brings this node back for the job-wide restart.
void AgentCore::start_exit_barrier() {
  auto store = last_round->store;
  int64_t nodes = last_round->group_world_size;
  int64_t round = last_round->round;
  log_info("waiting for the other {} node(s) to finish (up to {:.0f} s)", nodes - 1,
           to_seconds(kExitBarrierTimeout));
  auto g = gate;
  const int64_t gen = state_.generation;
  std::thread([this, store, nodes, round, g, gen]() {
    bool ok = true;
    try {
      wait_exit_barrier(*store, round, nodes);
    } catch (const std::exception& e) {
      ok = false;
      log_warning("not every node reached the exit barrier: {}", e.what());
    }
    post_from_thread(g, [this, gen, ok]() {
      Event done{Event::Kind::kBarrierDone};
      done.generation = gen;
      done.flag = ok;
      post(done);
    });
  }).detach();
}

void AgentCore::finish_now(int code) {
  monitor->events().emit("job_finished", {{"exit_code", code}, {"restarts", state_.restarts_used}});
  workers_.report_output_losses();
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
  const bool passed_exit_barrier = state_.passed_exit_barrier;
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
  signals_.cancel();
  io.stop();
}

}  // namespace dlaunch
