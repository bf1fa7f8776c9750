#include "launcher/agent/agent_rendezvous.h"

#include <fmt/format.h>
#include <signal.h>

#include <algorithm>

#include "common/log.h"
#include "launcher/agent/agent_core.h"
#include "rendezvous/tcp/tcp_store_server.h"
#include "rendezvous/tcp/worker_namespace.h"

namespace dlaunch {
namespace {

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

void RendezvousLoop::begin_generation() {
  agent_.phase = AgentPhase::kRendezvous;
  agent_.stuck_elsewhere.reset();
  if (!agent_.opts.rendezvous) {
    RendezvousResult r;
    r.round = agent_.generation + 1;
    r.group_rank = 0;
    r.group_world_size = 1;
    r.local_world_sizes = {agent_.cfg.nproc_per_node};
    r.hosts = {agent_.opts.host};
    r.master_addr = agent_.cfg.master_addr;
    r.master_port = agent_.master_port;
    r.restart_count = agent_.restarts_used;
    // Each attempt's workers get a key namespace of their own, as a rendezvous round's do:
    // PyTorch 2.x workers put no restart count in their keys, so a restarted rank would
    // otherwise read the killed group's gloo addresses.
    if (agent_.opts.store_server) {
      agent_.opts.store_server->begin_worker_namespace_local(
          worker_namespace(agent_.cfg.run_id, r.round));
    }
    agent_.workers.start(r);
    return;
  }
  // next_rendezvous() blocks: run it off the loop, then come back to spawn on the loop thread.
  agent_.monitor->events().emit("rendezvous_opened", {{"restarts", agent_.restarts_used}});
  // While the round forms this loop is idle; after it, every agent of the job spawns at once.
  agent_.files.prepare_attempt(agent_.generation + 1, agent_.cfg.nproc_per_node);
  agent_.opts.rendezvous->prepare_watch();
  if (round_thread_.joinable()) round_thread_.join();
  auto handler = agent_.opts.rendezvous;
  auto g = agent_.gate;
  round_thread_ = std::thread([this, handler, g]() {
    try {
      RendezvousResult r = handler->next_rendezvous();
      post_from_thread(g, [this, r]() { on_round_done(r); });
    } catch (const JobFinishedError& e) {
      std::string msg = e.what();
      post_from_thread(g, [this, msg]() { on_job_finished_while_waiting(msg); });
    } catch (const NodeMismatchError& e) {
      std::string msg = e.what();
      post_from_thread(g, [this, msg]() { on_round_failed(msg, exit_codes::kNodeMismatch); });
    } catch (const std::exception& e) {
      std::string msg = e.what();
      post_from_thread(g, [this, msg]() { on_round_failed(msg, exit_codes::kWorkersFailed); });
    }
  });
}

void RendezvousLoop::on_round_done(const RendezvousResult& r) {
  if (agent_.phase == AgentPhase::kDone) return;
  // A large round's table names no hosts (round_table.h): its members would be N empty
  // strings, written by each of the N agents just when they all start their workers.
  const bool hosts_known = std::none_of(r.hosts.begin(), r.hosts.end(),
                                        [](const std::string& h) { return h.empty(); });
  EventFields closed{{"round", r.round},
                     {"node_rank", r.group_rank},
                     {"nodes", r.group_world_size},
                     {"restart_count", r.restart_count}};
  if (hosts_known) closed.emplace_back("members", r.hosts);
  agent_.monitor->events().emit("rendezvous_closed", closed);
  // The workers first: publishing the status endpoint starts a thread that talks to the store,
  // and with N agents released by one round close that would compete with the N spawns (the
  // event watcher's thread and connection were made ahead, in begin_generation). Nothing is
  // missed by watching after the spawn: this loop thread handles the workers' exits only after
  // this function, and the watcher reads the round's event key, which holds an event posted
  // meanwhile.
  agent_.workers.start(r);
  if (agent_.phase == AgentPhase::kDone) return;  // the workers could not start and the agent ended
  agent_.monitor->publish([store = r.store]() { return store; });
  auto g = agent_.gate;
  agent_.opts.rendezvous->watch([this, g](const RendezvousEvent& ev) {
    post_from_thread(g, [this, ev]() { on_event(ev); });
  });
}

void RendezvousLoop::on_round_failed(const std::string& msg, int exit_code) {
  if (agent_.phase == AgentPhase::kDone) return;
  log_error("rendezvous failed: {}", msg);
  agent_.monitor->events().emit("rendezvous_failed", {{"error", msg}});
  agent_.finish(exit_code);
}

// A spare node of a full job: the job succeeded without it, which is no failure of its own.
void RendezvousLoop::on_job_finished_while_waiting(const std::string& msg) {
  if (agent_.phase == AgentPhase::kDone) return;
  log_info("{}", msg);
  agent_.monitor->events().emit("job_finished_elsewhere", {{"reason", msg}});
  agent_.finish_now(exit_codes::kSuccess);
}

void RendezvousLoop::on_event(const RendezvousEvent& ev) {
  agent_.monitor->events().emit(rendezvous_event_name(ev.kind), {{"reason", ev.reason}});
  if (ev.kind == RendezvousEvent::Kind::kStoreLost) return on_store_lost(ev.reason);
  if (agent_.phase == AgentPhase::kExitBarrier) return on_event_after_success(ev);
  if (agent_.phase != AgentPhase::kRunning && agent_.phase != AgentPhase::kCapturing) return;
  switch (ev.kind) {
    case RendezvousEvent::Kind::kMembershipChanged:
      log_warning("membership changed: {}; restarting the workers (not counted as a restart)",
                  ev.reason);
      agent_.cause.record(StopKind::kMembershipChange);
      agent_.group->on_stop_requested("membership changed: " + ev.reason);
      agent_.stop_group(SIGTERM);
      break;
    case RendezvousEvent::Kind::kRestartRequested:
      log_warning("another node asked for a restart: {}", ev.reason);
      agent_.group->on_stop_requested("restart requested by another node: " + ev.reason);
      agent_.cause.record(StopKind::kPeerRestart);
      // Mid-hang (another node saw it first): read the stacks and compare the verdicts first,
      // which is bounded; HangWatch::end stops the group. The same when workers here are
      // silent but not yet past --hang_timeout (the stuck rank's node saw it first).
      if (agent_.phase == AgentPhase::kCapturing || agent_.hangs.investigate_for_peer()) break;
      agent_.stop_group(SIGTERM);
      break;
    case RendezvousEvent::Kind::kShutdownRequested:
      log_info("the job is shutting down: {}", ev.reason);
      agent_.group->on_stop_requested("shutdown requested: " + ev.reason);
      agent_.cause.record(StopKind::kPeerShutdown);
      agent_.stop_group(SIGTERM);
      break;
    case RendezvousEvent::Kind::kStoreLost:
      break;  // on_store_lost
  }
}

// No round can form again, so stop the workers and exit with the handler's sentence. In the
// rendezvous phase the round itself fails with that sentence; while a failure is being settled,
// the verdict carries it.
void RendezvousLoop::on_store_lost(const std::string& reason) {
  if (agent_.phase == AgentPhase::kDone || !agent_.store_lost.empty()) return;
  agent_.store_lost = reason;
  agent_.cause.record(StopKind::kStoreLost);
  if (agent_.phase == AgentPhase::kExitBarrier) {
    log_error("{}", reason);
    return agent_.finish_now(exit_codes::kWorkersFailed);
  }
  if (agent_.phase == AgentPhase::kRunning || agent_.phase == AgentPhase::kCapturing) {
    agent_.group->on_stop_requested(reason);
    agent_.stop_group(SIGTERM);
  }
}

// A failure elsewhere restarts everyone (the job-wide budget permitting), a closed rendezvous
// means the job failed elsewhere.
void RendezvousLoop::on_event_after_success(const RendezvousEvent& ev) {
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
    return agent_.finish_now(exit_codes::kWorkersFailed);
  }
}

void RendezvousLoop::rejoin_after_success(const RendezvousEvent& ev) {
  if (agent_.restart_count() < agent_.cfg.max_restarts) {
    log_warning("another node failed after this node's workers finished ({}); rejoining "
                "for the job-wide restart",
                ev.reason);
    ++agent_.restarts_used;
    agent_.earlier_failures.push_back(
        fmt::format("attempt {}: {}", agent_.group->attempt(), ev.reason));
    return begin_generation();
  }
  log_error("another node failed ({}) and the restart budget ({}) is spent", ev.reason,
            agent_.cfg.max_restarts);
  agent_.finish_now(exit_codes::kWorkersFailed);
}

void RendezvousLoop::settle_failure(std::function<void(const FailureVerdict&)> then) {
  if (settle_thread_.joinable()) settle_thread_.join();
  settling_ = true;
  auto handler = agent_.opts.rendezvous;
  auto g = agent_.gate;
  const int64_t gen = agent_.generation;
  std::thread report = std::move(report_thread_);
  settle_thread_ = std::thread([this, handler, g, gen, then, report = std::move(report)]() mutable {
    if (report.joinable()) report.join();  // this node's own failure is published first
    FailureVerdict v;
    try {
      v = handler->settle_failure();
    } catch (const std::exception& e) {
      log_warning("could not find out whether a node was lost ({}); counting the failure",
                  e.what());
    }
    post_from_thread(g, [this, gen, v, then]() { on_verdict(gen, v, then); });
  });
}

void RendezvousLoop::on_verdict(int64_t gen, const FailureVerdict& v,
                                const std::function<void(const FailureVerdict&)>& then) {
  if (gen != agent_.generation || agent_.phase == AgentPhase::kDone || !settling_) return;
  settling_ = false;
  if (agent_.cause.is(StopKind::kPreempted) && agent_.phase != AgentPhase::kExitBarrier) {
    return agent_.decide();  // exits 75
  }
  if (v.kind == FailureVerdict::Kind::kStoreLost) {
    agent_.store_lost = v.reason;
    agent_.cause.record(StopKind::kStoreLost);
    log_error("{}", v.reason);
    return agent_.finish(exit_codes::kWorkersFailed);
  }
  then(v);
}

void RendezvousLoop::report_to_peers(const std::string& report) {
  // Nobody to tell; the sentence is printed once, in decide().
  if (!agent_.store_lost.empty()) return;
  if (report_thread_.joinable()) report_thread_.detach();  // an earlier one, long done
  auto handler = agent_.opts.rendezvous;
  report_thread_ = std::thread([handler, report]() {
    try {
      handler->request_restart(report);
    } catch (const std::exception& e) {
      log_warning("could not tell the other nodes about the failure: {}", e.what());
    }
  });
}

void RendezvousLoop::detach_threads() {
  // A round still blocked in next_rendezvous (the agent was stopped during it) holds its own
  // reference to the handler and can no longer post (the gate is closed). Likewise a failure
  // verdict still awaited (bounded by the keep-alive window) and a report on its way.
  if (round_thread_.joinable()) round_thread_.detach();
  if (settle_thread_.joinable()) settle_thread_.detach();
  if (report_thread_.joinable()) report_thread_.detach();
}

}  // namespace dlaunch
