#include "launcher/agent/agent_rendezvous.h"

#include <fmt/format.h>
#include <signal.h>

#include <algorithm>

#include "common/log.h"
#include "launcher/agent/rank_replacement.h"
#include "launcher/agent/shrink_agreement.h"
#include "rendezvous/store/prefix_store.h"
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
  agent_.stuck_elsewhere.reset();
  if (!agent_.opts.rendezvous) {
    RendezvousResult r;
    r.round = agent_.state().generation + 1;
    r.group_rank = 0;
    r.group_world_size = 1;
    r.local_world_sizes = {agent_.cfg.nproc_per_node};
    r.hosts = {agent_.opts.host};
    r.master_addr = agent_.cfg.master_addr;
    r.master_port = agent_.master_port;
    r.restart_count = agent_.state().restarts_used;
    // Each attempt's workers get a key namespace of their own, as a rendezvous round's do:
    // PyTorch 2.x workers put no restart count in their keys, so a restarted rank would
    // otherwise read the killed group's gloo addresses.
    if (agent_.opts.store_server) {
      agent_.opts.store_server->begin_worker_namespace_local(
          worker_namespace(agent_.cfg.run_id, r.round));
    }
    round_formed(r);
    return;
  }
  // next_rendezvous() blocks: run it off the loop, then come back to spawn on the loop thread.
  agent_.monitor->events().emit("rendezvous_opened", {{"restarts", agent_.state().restarts_used}});
  // While the round forms this loop is idle; after it, every agent of the job spawns at once.
  agent_.files.prepare_attempt(agent_.state().generation + 1, agent_.cfg.nproc_per_node);
  join_round(nullptr, nullptr);
}

void RendezvousLoop::begin_keeping_workers() {
  agent_.stuck_elsewhere.reset();
  agent_.monitor->events().emit("rendezvous_opened", {{"restarts", agent_.state().restarts_used},
                                                      {"keeping_workers", true}});
  const std::shared_ptr<Store> old_store = agent_.last_round->store;
  const int64_t old_round = agent_.last_round->round;
  const std::string kept_namespace = worker_namespace(agent_.cfg.run_id, agent_.workers_round);
  const bool can_shrink = agent_.generation_before_shrink.has_value() && old_store;
  // The workers' store: a round that names another (etcd's node 0 lost) cannot shrink them.
  const std::string workers_store = fmt::format("{}:{}", agent_.last_round->master_addr,
                                                agent_.last_round->master_port);
  // Only the nodes that kept their workers come back (the lost one is gone): the round need not
  // wait its last call for newcomers, who would end the shrink anyway.
  if (can_shrink) {
    agent_.opts.rendezvous->expect_nodes(agent_.last_round->group_world_size - 1);
  }
  auto marked = std::make_shared<bool>(false);
  auto before = [old_store, old_round, can_shrink, marked]() {
    if (!can_shrink) return;
    // Before the join: the round cannot complete without this node, so its members read it.
    try {
      mark_kept_workers(*old_store, old_round);
      *marked = true;
    } catch (const std::exception& e) {
      log_warning("cannot tell the other nodes that this node kept its workers ({}); the group "
                  "restarts in the new round",
                  e.what());
    }
  };
  auto after = [old_round, kept_namespace, workers_store,
                marked](const RendezvousResult& r) -> bool {
    if (!*marked || !r.store) return false;
    if (fmt::format("{}:{}", r.master_addr, r.master_port) != workers_store) {
      log_warning("the new round's workers' store is {}:{}, not the running workers' {}: the "
                  "group restarts in it",
                  r.master_addr, r.master_port, workers_store);
      return false;
    }
    bool shrink = false;
    try {
      shrink = agree_to_shrink(*r.store, old_round, r.round, r.group_world_size);
    } catch (const std::exception& e) {
      log_warning("cannot agree with the other nodes on a shrink in place ({}); the group "
                  "restarts in the new round",
                  e.what());
      return false;
    }
    if (!shrink) return false;
    // The round's release began a new namespace for workers that never come: the group's
    // later replacements must meet its workers in theirs.
    try {
      if (auto* prefixed = dynamic_cast<PrefixStore*>(r.store.get())) {
        begin_worker_namespace(*prefixed->base(), kept_namespace);
      }
    } catch (const std::exception& e) {
      log_warning("cannot keep the workers' store namespace {} ({}); a rank replaced alone "
                  "later may not find the others",
                  kept_namespace, e.what());
    }
    return true;
  };
  join_round(before, after);
}

void RendezvousLoop::join_round(std::function<void()> before,
                                std::function<bool(const RendezvousResult&)> after) {
  agent_.opts.rendezvous->prepare_watch();
  if (round_thread_.joinable()) round_thread_.join();
  auto handler = agent_.opts.rendezvous;
  auto g = agent_.gate;
  round_thread_ = std::thread([this, handler, g, before, after]() {
    try {
      if (before) before();
      RendezvousResult r = handler->next_rendezvous();
      const bool every_node_kept = after && after(r);
      post_from_thread(g, [this, r, every_node_kept]() { on_round_done(r, every_node_kept); });
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

// The round is the agent's from here: the workers start (kStartWorkers) for it.
void RendezvousLoop::round_formed(const RendezvousResult& r, bool every_node_kept) {
  agent_.last_round = r;
  Event formed{Event::Kind::kRoundFormed};
  formed.count = r.restart_count;
  formed.flag = r.store != nullptr && r.group_world_size > 1;
  formed.every_node_kept = every_node_kept;
  agent_.post(formed);
}

void RendezvousLoop::on_round_done(const RendezvousResult& r, bool every_node_kept) {
  if (agent_.state().phase == AgentPhase::kDone) return;
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
  round_formed(r, every_node_kept);
  // The workers could not start and the agent ended.
  if (agent_.state().phase == AgentPhase::kDone) return;
  agent_.monitor->publish([store = r.store]() { return store; });
  auto g = agent_.gate;
  agent_.opts.rendezvous->watch([this, g](const RendezvousEvent& ev) {
    post_from_thread(g, [this, ev]() { on_event(ev); });
  });
}

void RendezvousLoop::on_round_failed(const std::string& msg, int exit_code) {
  if (agent_.state().phase == AgentPhase::kDone) return;
  log_error("rendezvous failed: {}", msg);
  agent_.monitor->events().emit("rendezvous_failed", {{"error", msg}});
  Event failed{Event::Kind::kRoundFailed};
  failed.code = exit_code;
  agent_.post(failed);
}

// A spare node of a full job: the job succeeded without it, which is no failure of its own.
void RendezvousLoop::on_job_finished_while_waiting(const std::string& msg) {
  if (agent_.state().phase == AgentPhase::kDone) return;
  log_info("{}", msg);
  agent_.monitor->events().emit("job_finished_elsewhere", {{"reason", msg}});
  agent_.post({Event::Kind::kJobFinishedElsewhere});
}

void RendezvousLoop::on_event(const RendezvousEvent& ev) {
  agent_.monitor->events().emit(rendezvous_event_name(ev.kind), {{"reason", ev.reason}});
  Event e{Event::Kind::kPeerEvent};
  e.text = ev.reason;
  switch (ev.kind) {
    case RendezvousEvent::Kind::kMembershipChanged:
      e.peer = Event::Peer::kMembershipChanged;
      // What step() needs to keep the workers for an in-process shrink.
      e.flag = ev.node_gone;
      if (agent_.group && agent_.recovery.on()) {
        e.announced = all_announced(*agent_.group);
        e.in_flight = replacement_in_flight(*agent_.group, agent_.opts.last_beat);
      }
      break;
    case RendezvousEvent::Kind::kRestartRequested:
      e.peer = Event::Peer::kRestartRequested;
      break;
    case RendezvousEvent::Kind::kShutdownRequested:
      e.peer = Event::Peer::kShutdownRequested;
      break;
    case RendezvousEvent::Kind::kStoreLost:
      // The job's store is gone (c10d: the agent hosting it died).
      e.kind = Event::Kind::kStoreLost;
      break;
  }
  agent_.post(e);
}

void RendezvousLoop::settle_failure() {
  if (settle_thread_.joinable()) settle_thread_.join();
  auto handler = agent_.opts.rendezvous;
  auto g = agent_.gate;
  const int64_t gen = agent_.state().generation;
  std::thread report = std::move(report_thread_);
  settle_thread_ = std::thread([this, handler, g, gen, report = std::move(report)]() mutable {
    if (report.joinable()) report.join();  // this node's own failure is published first
    FailureVerdict v;
    try {
      v = handler->settle_failure();
    } catch (const std::exception& e) {
      log_warning("could not find out whether a node was lost ({}); counting the failure",
                  e.what());
    }
    Event verdict{Event::Kind::kFailureVerdict};
    verdict.generation = gen;
    verdict.text = v.reason;
    switch (v.kind) {
      case FailureVerdict::Kind::kNodeLost:
        verdict.verdict = Event::Verdict::kNodeLost;
        break;
      case FailureVerdict::Kind::kStoreLost:
        verdict.verdict = Event::Verdict::kStoreLost;
        break;
      case FailureVerdict::Kind::kCharged:
        verdict.verdict = Event::Verdict::kCounted;
        break;
    }
    post_from_thread(g, [this, verdict]() { agent_.post(verdict); });
  });
}

void RendezvousLoop::report_to_peers(const std::string& report) {
  // Nobody to tell; the sentence is printed once, when the job ends.
  if (!agent_.state().store_lost.empty()) return;
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
