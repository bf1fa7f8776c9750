#include "rendezvous/handlers/dynamic_rendezvous.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <thread>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/tcp/default_ports.h"
#include "rendezvous/tcp/host_port.h"
#include "rendezvous/tcp/job_token.h"
#include "rendezvous/store/prefix_store.h"
#include "rendezvous/handlers/round_table.h"
#include "rendezvous/handlers/store_ledger.h"
#include "rendezvous/handlers/version_mix.h"

namespace dlaunch {

DynamicRendezvous::DynamicRendezvous(const RendezvousParams& params)
    : DynamicRendezvous(params, nullptr) {}

DynamicRendezvous::DynamicRendezvous(const RendezvousParams& params,
                                     std::shared_ptr<RoundLedger> ledger)
    : params_(params),
      config_(RendezvousConfig::parse(params.config)),
      clock_(params.clock ? *params.clock : steady_clock()),
      ledger_(std::move(ledger)) {
  if (params_.min_nodes < 1 || params_.max_nodes < params_.min_nodes) {
    throw UsageError(fmt::format("--nnodes {}:{} is not a valid range; expected 1 <= MIN <= MAX",
                                 params_.min_nodes, params_.max_nodes));
  }
  limits_ = {params_.min_nodes, params_.max_nodes, config_.last_call_timeout};
  prefix_ = key_prefix(params_.run_id);
  node_id_ = detail::make_node_id(params_.host);
  store_ = detail::connect_store(params_, config_);
  open_store_ = detail::store_opener(params_, config_, store_);
  watcher_ = std::make_unique<EventWatcher>(open_store_, prefix_, node_id_,
                                            std::chrono::seconds(1));
  // c10d: the store is hosted by one agent and dies with it. A backend that brings its own
  // ledger (etcd) keeps its store outside any agent: an outage there is waited out.
  const bool store_dies_with_host = !ledger_;
  if (!ledger_) {
    ledger_ = std::make_shared<StoreRoundLedger>(store_, prefix_, config_.keep_alive_interval,
                                                 clock_);
  }
  release_ = std::make_unique<RoundRelease>(
      RoundRelease::Settings{params_.run_id, prefix_, limits_.min_nodes, keep_alive_window()},
      store_, ledger_, clock_);
  store_loss_ = std::make_unique<StoreLoss>(store_);
  verdicts_ = std::make_unique<FailureVerdicts>(
      FailureVerdicts::Settings{params_.run_id, prefix_, node_id_, config_.keep_alive_interval,
                                config_.keep_alive_max_attempt},
      store_, *store_loss_, clock_);
  keep_alive_ = std::make_unique<KeepAlive>(
      KeepAlive::Settings{params_.run_id, prefix_, node_id_, params_.host, params_.endpoint,
                          config_.keep_alive_interval, config_.keep_alive_max_attempt,
                          store_dies_with_host},
      open_store_, [this](std::shared_ptr<Store> store) { return make_liveness(std::move(store)); },
      *verdicts_, *store_loss_, clock_);
}

std::unique_ptr<Liveness> DynamicRendezvous::make_liveness(std::shared_ptr<Store> store) const {
  // The backend's liveness (etcd: leases), else heartbeats through the store.
  const auto& factory = params_.liveness ? params_.liveness : LivenessFactory(make_store_liveness);
  return factory(std::move(store), prefix_, node_id_, keep_alive_window(), clock_);
}

DynamicRendezvous::~DynamicRendezvous() { shutdown(); }

std::string DynamicRendezvous::round_key(int64_t round, const std::string& suffix) const {
  return ledger_round_key(prefix_, round, suffix);
}

std::optional<DynamicState> DynamicRendezvous::read_state() {
  // compare_set with an expected value no record ever has: returns the current record, or our
  // impossible `expected` when there is none. One round trip, never blocks, never writes.
  static const Bytes kProbe = to_bytes("\x01probe");
  Bytes v = store_->compare_set(key("state"), kProbe, kProbe);
  if (v == kProbe) return std::nullopt;
  return DynamicState::decode(v);
}

std::optional<DynamicState> DynamicRendezvous::read_or_create_state() {
  // compare_set from missing: the record now stored, ours when there was none. What a joining
  // node does with no record is create this one (decide_join's kCreate), so one round trip
  // replaces three (read nothing, create, read again) for each of the N agents started at once.
  const DynamicState first{0, DynamicState::Status::kOpen, 0};
  return DynamicState::decode(store_->compare_set(key("state"), Bytes(), first.encode()));
}

RendezvousResult DynamicRendezvous::next_rendezvous() {
  keep_alive_->start();
  JoinAttempt attempt;
  attempt.deadline = clock_.now() + config_.join_timeout;
  attempt.notes = WaitNotes(clock_.now());
  view_.running_round_dead = false;
  view_.expected_arrivals = expected_nodes_.exchange(0);
  if (view_.expected_arrivals > 0) {
    log_debug("rendezvous {}: the next round completes once {} nodes joined (no last call)",
              params_.run_id, view_.expected_arrivals);
  }
  while (true) {
    throw_if_store_lost();
    try {
      if (auto result = join_step(attempt)) {
        note_joined("");
        return *result;
      }
      continue;
    } catch (const ClosedError& e) {  // also StoreInterruptedError (store loss declared)
      retry_or_rethrow(attempt.deadline, e);
    } catch (const ConnectionError& e) {
      // A reconnect failed (within seconds): the keep-alive decides whether the store is gone.
      retry_or_rethrow(attempt.deadline, e);
    }
    // Retry soon, or at once when the keep-alive declares the store lost.
    store_loss_->wait_for(std::chrono::milliseconds(200));
  }
}

void DynamicRendezvous::retry_or_rethrow(TimePoint deadline, const Error& e) {
  throw_if_store_lost();
  if (clock_.now() >= deadline) throw;  // the exception being handled (a caller's catch)
  log_debug("rendezvous {}: {}; retrying", params_.run_id, e.what());
}

std::optional<RendezvousResult> DynamicRendezvous::join_step(JoinAttempt& a) {
  if (!a.fresh) a.state = read_or_create_state();
  auto now = clock_.now();
  if (!a.fresh) refresh_arrivals(a.state, now);
  a.fresh = false;
  check_running_round_gone(a, now);
  JoinDecision d = decide_join(a.state, view_, limits_, now);
  log_debug("rendezvous {}: round {} step {}", params_.run_id, a.state ? a.state->round : -1,
            join_step_name(d.step));
  if (!act(d, a, now)) return std::move(a.result);  // a result, or decide again at once
  if (now >= a.deadline) throw_join_timeout(a, d);
  if (d.step == JoinStep::kWaitNextRound) {
    note_joined(fmt::format("the job is full and running ({} of --nnodes MAX={} nodes); this "
                            "node waits for a place",
                            a.state->participants, limits_.max_nodes));
  } else if (d.step == JoinStep::kWait && view_.joined_round == a.state->round) {
    note_joined(fmt::format("{} of --nnodes {}:{} nodes joined round {}", view_.arrivals,
                            limits_.min_nodes, limits_.max_nodes, a.state->round));
  }
  if ((d.step == JoinStep::kWait || d.step == JoinStep::kWaitNextRound) && a.notes.due(now)) {
    note_waiting(a, d, now);
  }
  const int64_t round = a.state->round;
  if (d.step == JoinStep::kWaitNextRound) {
    // A late arrival: woken when the next round opens (or the running one finished), and
    // meanwhile looks at the running round's nodes once per keep-alive interval
    // (check_running_round_gone).
    if (a.finish_checked_round != round) check_finished_while_waiting(a, round, true);
    ledger_->wait(round, round_key(round, "superseded"), nullptr,
                  std::min(a.deadline, now + config_.keep_alive_interval));
    check_finished_while_waiting(a, round, false);
  } else if (!wait_in_my_round(a)) {
    ledger_->wait(round, round_key(round, "done"), &limits_, a.deadline);
  }
  return std::move(a.result);
}

bool DynamicRendezvous::wait_in_my_round(JoinAttempt& a) {
  const DynamicState& open = *a.state;
  if (open.status != DynamicState::Status::kOpen || view_.joined_round != open.round) {
    return false;
  }
  // What this node decides by comes with the wait's end (one WAIT_GET on the TCP store): its
  // place once the round is released, else the state and the arrivals, so a woken node reads
  // none of them again.
  // done, table, assignment, restart_count
  auto keys = release_->place_keys(open.round, view_.arrival_index);
  const size_t state_at = keys.size();
  keys.push_back(key("state"));
  auto fetched = ledger_->wait_fetching(open.round, keys, &limits_, a.deadline);
  if (!fetched) return true;  // nothing read: decide again, reading
  const auto& values = fetched->got.values;
  const auto& done = values[0];
  bool released = fetched->got.ready && done && RoundRelease::released_with_table(*done);
  for (size_t i = 1; released && i < state_at; ++i) released = values[i].has_value();
  if (released) {
    RoundRelease::Place place = release_->decode_place(*values[1], *values[2], *values[3]);
    DynamicState complete{open.round, DynamicState::Status::kComplete, place.table.participants};
    a.result = enter_round(complete, std::move(place));
    if (a.result) return true;
    view_.arrival_index = std::numeric_limits<int64_t>::max();  // formed without this node
  }
  // Anything else (the slice ended, the round was closed or reopened, an older closer, this
  // node counted in too late): decide by the state and the count just read.
  const auto& state = values[state_at];
  a.state = state ? std::optional<DynamicState>(DynamicState::decode(*state)) : std::nullopt;
  if (a.state && a.state->status == DynamicState::Status::kOpen &&
      view_.joined_round == a.state->round) {
    take_arrivals(fetched->arrivals);
  }
  a.fresh = true;
  return true;
}

void DynamicRendezvous::refresh_arrivals(const std::optional<DynamicState>& state,
                                         TimePoint now) {
  if (!state || state->status != DynamicState::Status::kOpen ||
      view_.joined_round != state->round) {
    return;
  }
  take_arrivals(ledger_->arrivals(state->round, now));
}

void DynamicRendezvous::take_arrivals(const RoundLedger::Count& count) {
  if (count.arrivals != view_.arrivals) {
    view_.arrivals = count.arrivals;
    view_.arrivals_changed_at = count.changed_at;
  }
}

void DynamicRendezvous::note_waiting(const JoinAttempt& a, const JoinDecision& d,
                                     TimePoint now) {
  const std::string how_long = a.notes.how_long(now, config_.join_timeout);
  const int64_t round = a.state ? a.state->round : 0;
  if (d.step == JoinStep::kWaitNextRound) {
    log_info("rendezvous '{}': still waiting for a place in the running round {} ({} of "
             "--nnodes {}:{} nodes) {}",
             params_.run_id, round, a.state ? a.state->participants : 0, limits_.min_nodes,
             limits_.max_nodes, how_long);
    return;
  }
  // Who joined: read by the round's first arrival only, and only for a small round, so a
  // large job's waiting nodes add no requests.
  std::string who;
  if (view_.arrival_index == 1 && view_.arrivals <= 16 && view_.joined_round == round) {
    for (const auto& node : ledger_->described(round, view_.arrivals, now).nodes) {
      who += (who.empty() ? ": " : ", ") + node.host;
    }
  }
  log_info("rendezvous '{}': waiting for the other nodes ({} of --nnodes {}:{} joined round "
           "{}{}) {}; every node needs the same --rdzv_id and --rdzv_endpoint {}",
           params_.run_id, view_.arrivals, limits_.min_nodes, limits_.max_nodes, round, who,
           how_long, params_.endpoint);
}

void DynamicRendezvous::check_finished_while_waiting(JoinAttempt& a, int64_t round,
                                                     bool first_look) {
  const bool finished = store_->check({round_key(round, "finished")});
  if (first_look) {
    a.finish_checked_round = round;
    a.finished_before = finished;
    return;
  }
  if (!finished || a.finished_before) return;
  // The finishing node waits a moment for the waiting nodes to be told before its store goes.
  store_->add(round_key(round, "finished_told"), 1);
  throw JobFinishedError(fmt::format(
      "rendezvous '{}': the job finished (its {} node(s) succeeded) while this node waited for "
      "a place; this node had no part in it and has nothing left to do",
      params_.run_id, a.state ? a.state->participants : 0));
}

void DynamicRendezvous::check_running_round_gone(JoinAttempt& a, TimePoint now) {
  const auto& s = a.state;
  if (!s || s->status != DynamicState::Status::kComplete || view_.joined_round != s->round ||
      view_.arrival_index <= s->participants ||
      now - a.last_gone_check < config_.keep_alive_interval) {
    return;
  }
  // Waiting for the next round. Normally a running node opens it once told; if every node of
  // the running round is gone, nobody will: find out (once per keep-alive interval).
  a.last_gone_check = now;
  if (!a.waiting_liveness) a.waiting_liveness = make_liveness(store_);
  std::vector<std::string> ids;
  for (const auto& node : ledger_->described(s->round, s->participants, now).nodes) {
    ids.push_back(node.id);
  }
  // Gone, not only dead: nodes that left cleanly (the whole job was stopped, and is now
  // started again with the same run id) will not open the next round either.
  view_.running_round_dead = !ids.empty() && a.waiting_liveness->gone(ids).size() == ids.size();
}

bool DynamicRendezvous::act(const JoinDecision& d, JoinAttempt& a, TimePoint now) {
  switch (d.step) {
    case JoinStep::kClosed:
      throw StateError(fmt::format(
          "rendezvous '{}' is closed: the job finished or failed on another node; no new round "
          "will start",
          params_.run_id));
    case JoinStep::kCreate:
      store_->compare_set(key("state"), Bytes(), d.next.encode());
      return false;
    case JoinStep::kJoin:
      join_round(a.state->round, now);
      a.announced_waiting = false;
      a.fresh = true;  // decide at once: complete at MAX, or announce ourselves
      return false;
    case JoinStep::kComplete:
      // compare_set returns the value now stored, so every node that tried it sees
      // COMPLETE(r, n), not only the one that wrote it (hundreds at 2,048 nodes): one add
      // picks the closer among them.
      if (store_->compare_set(key("state"), a.state->encode(), d.next.encode()) ==
              d.next.encode() &&
          store_->add(round_key(a.state->round, "closer"), 1) == 1) {
        release_->release(d.next, a.deadline);
      }
      return false;
    case JoinStep::kOpenNext:
      if (store_->compare_set(key("state"), a.state->encode(), d.next.encode()) ==
          d.next.encode()) {
        store_->set(round_key(a.state->round, "superseded"), to_bytes("1"));
      }
      return false;
    case JoinStep::kDone:
      a.result = finish_round(*a.state, a.deadline);
      // Not in this round: join the next one (already open when the round was given up; else
      // as a late arrival, once it opens).
      if (!a.result) view_.arrival_index = std::numeric_limits<int64_t>::max();
      return false;
    case JoinStep::kWaitNextRound:
      if (!a.announced_waiting) {
        a.announced_waiting = true;
        if (a.state->participants < limits_.max_nodes) {
          publish_event(*store_, prefix_, a.state->round,
                        {RendezvousEvent::Kind::kMembershipChanged, node_id_,
                         fmt::format("node {} is waiting to join", params_.host)});
        } else {
          // Nothing will happen for a while: say why this node waits, once.
          log_info("rendezvous '{}': the job is full ({} of --nnodes MAX={} nodes) and running; "
                   "this node waits for a place (a node lost or leaving), up to the join timeout",
                   params_.run_id, a.state->participants, limits_.max_nodes);
        }
      }
      return true;
    case JoinStep::kWait:
      return true;
  }
  return true;
}

void DynamicRendezvous::join_round(int64_t round, TimePoint now) {
  NodeDescriptor me{node_id_, params_.host, params_.local_world_size,
                    params_.node_rank ? *params_.node_rank : -1};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    me.previous_rank = my_rank_;
  }
  me.version = params_.version;
  int64_t index = ledger_->join(round, me);
  view_.joined_round = round;
  view_.arrival_index = index;
  view_.arrivals = index;
  view_.arrivals_changed_at = now;
}

void DynamicRendezvous::throw_join_timeout(const JoinAttempt& a, const JoinDecision& d) {
  std::string token_hint;
  if (job_token_refusals() > 0) {
    token_hint = fmt::format(
        "; this node's store refused {} client(s) for a job token that differs from its own: "
        "give every node the same DLAUNCH_JOB_TOKEN",
        job_token_refusals());
  }
  throw TimeoutError(fmt::format(
      "rendezvous '{}': join_timeout ({:g} s) passed with {} node(s) in round {}, fewer than "
      "--nnodes MIN={}{}{}; check that the other agents run with the same --rdzv_id and "
      "--rdzv_endpoint {}",
      params_.run_id, to_seconds(config_.join_timeout), view_.arrivals,
      a.state ? a.state->round : 0, limits_.min_nodes,
      d.step == JoinStep::kWaitNextRound ? " (this node waits for a full round to restart)" : "",
      token_hint, params_.endpoint));
}

std::optional<RendezvousResult> DynamicRendezvous::finish_round(const DynamicState& state,
                                                                TimePoint deadline) {
  // The completing node starts the round's worker namespace and then sets "done": wait for it,
  // so no worker of this round starts before.
  auto released = release_->wait(state, view_.arrival_index, deadline);
  const Bytes done = released[0].value_or(Bytes());
  if (RoundRelease::reopened(done)) {
    log_info("rendezvous '{}' round {} had fewer than --nnodes MIN={} live nodes; joining the "
             "next round",
             params_.run_id, state.round, limits_.min_nodes);
    return std::nullopt;
  }
  return enter_round(state,
                     release_->read_place(state, view_.arrival_index, released, deadline));
}

std::optional<RendezvousResult> DynamicRendezvous::enter_round(const DynamicState& state,
                                                               RoundRelease::Place place) {
  auto& [table, me, restart_count] = place;
  const int64_t n = table.participants;
  if (me.rank < 0) {
    // Counted in, but so late describing itself that the closer went on without it: this
    // node waits for the next round like a late arrival.
    log_warning("rendezvous '{}' round {} formed without this node (it described itself after "
                "the keep-alive window); it joins the next round",
                params_.run_id, state.round);
    return std::nullopt;
  }
  if (n > state.participants || me.rank >= n) {
    throw ProtocolError(fmt::format(
        "rendezvous '{}' round {}: the round's table says {} node(s) and rank {} for this node, "
        "but the round has {} node(s); the store holds records of another job or build",
        params_.run_id, state.round, n, me.rank, state.participants));
  }
  if (!version_mix_warned_) {
    std::string mix = describe_version_mix(params_.version, table.host_builds());
    if (!mix.empty()) {
      log_warning("{}", mix);
      version_mix_warned_ = true;
    }
  }

  RendezvousResult result;
  result.round = state.round;
  result.group_world_size = n;
  result.group_rank = me.rank;
  result.local_world_sizes = table.local_world_sizes();
  result.hosts = table.hosts;
  if (result.hosts.empty()) {
    // A large round lists no hosts: this node's own and its neighbours' are known.
    result.hosts.assign(n, "");
    result.hosts[me.rank] = params_.host;
    for (const auto& w : me.watched) result.hosts[w.rank] = w.host;
  }
  HostPort master = parse_host_port(params_.endpoint.empty() ? "127.0.0.1" : params_.endpoint,
                                    kDefaultRendezvousPort, "--rdzv_endpoint");
  result.master_addr = master.host;
  result.master_port = master.port;
  result.restart_count = restart_count >= 0 ? restart_count : store_->add(key("restart_count"), 0);
  result.store = std::make_shared<PrefixStore>("dlaunch/job/" + params_.run_id, store_);
  view_.last_round = state.round;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_round_ = state.round;
    my_rank_ = result.group_rank;
  }
  verdicts_->enter_round(state.round, n);
  keep_alive_->watch_round(state.round, n, result.group_rank, std::move(me.watched));
  log_info("rendezvous '{}' round {} complete: node rank {} of {} (world size {})",
           params_.run_id, state.round, result.group_rank, n, result.world_size());
  return result;
}

void DynamicRendezvous::watch(std::function<void(const RendezvousEvent&)> on_event) {
  int64_t round;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    round = running_round_;
  }
  const std::string lost = store_loss_->tell(on_event);
  DL_CHECK(round >= 0) << "watch() before next_rendezvous()";
  if (!lost.empty()) {
    // Declared between the round and this call: nobody was told yet.
    if (on_event) on_event(RendezvousEvent{RendezvousEvent::Kind::kStoreLost, lost});
    return;
  }
  // A restart event means a worker failed somewhere: count this node in at once (it is alive),
  // so the verdict does not wait for this node's agent to stop its workers.
  // A membership change is a loss when the round's verdict says so: the keep-alive (or the
  // node that leaves) writes it before it publishes the event.
  watcher_->watch(round, [this, on_event](RendezvousEvent e) {
    if (e.kind == RendezvousEvent::Kind::kRestartRequested) {
      try {
        verdicts_->ack();
      } catch (const Error& err) {
        log_debug("rendezvous {}: could not count this node in after a failure: {}",
                  params_.run_id, err.what());
      }
    }
    if (e.kind == RendezvousEvent::Kind::kMembershipChanged) {
      try {
        e.node_gone = verdicts_->node_lost_now();
      } catch (const Error& err) {
        log_debug("rendezvous {}: could not read the round's verdict: {}", params_.run_id,
                  err.what());
      }
    }
    if (on_event) on_event(e);
  });
}

void DynamicRendezvous::request_restart(const std::string& report) {
  DL_CHECK(view_.last_round >= 0) << "request_restart() before next_rendezvous()";
  throw_if_store_lost();
  // The budget is charged by the verdict (settle_failure), not here: a node lost a moment ago
  // makes its peers' workers fail before anyone can tell.
  publish_event(*store_, prefix_, view_.last_round,
                {RendezvousEvent::Kind::kRestartRequested, node_id_, report});
  verdicts_->ack();
}

FailureVerdict DynamicRendezvous::settle_failure() { return verdicts_->settle(); }

void DynamicRendezvous::begin_leaving() { keep_alive_->begin_leaving(); }

int64_t DynamicRendezvous::num_nodes_waiting() {
  throw_if_store_lost();
  auto state = read_state();
  if (!state || state->status != DynamicState::Status::kComplete) return 0;
  int64_t arrivals = ledger_->arrivals(state->round, clock_.now()).arrivals;
  return std::max<int64_t>(0, arrivals - state->participants);
}

void DynamicRendezvous::mark_finished() {
  int64_t round, rank;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    round = running_round_;
    rank = my_rank_;
  }
  // One writer is enough: the store's host (its store goes next), else node rank 0.
  const bool hosts_store = hosted_store() != nullptr;
  if (round < 0 || (!hosts_store && rank != 0) || !store_loss_->reason().empty()) return;
  try {
    store_->set(round_key(round, "finished"), to_bytes("1"));
    store_->set(round_key(round, "superseded"), to_bytes("1"));  // wakes the waiting nodes
    if (!hosts_store) return;
    // They are told within a round trip of waking; one that died while waiting (still counted
    // as waiting) costs this bounded wait at the job's end, nothing more.
    const int64_t waiting = num_nodes_waiting();
    const auto until = clock_.now() + std::chrono::seconds(3);
    while (waiting > 0 && store_->add(round_key(round, "finished_told"), 0) < waiting &&
           clock_.now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const Error& e) {
    log_debug("rendezvous {}: could not mark the job finished: {}", params_.run_id, e.what());
  }
}

void DynamicRendezvous::set_closed() {
  // Nothing to close when the store is gone; a store that just died costs one bounded
  // reconnect (kStoreReconnectTimeout), never the join timeout.
  if (!store_loss_->reason().empty()) {
    log_debug("rendezvous {}: not closing it, the store is gone", params_.run_id);
    return;
  }
  while (true) {
    auto state = read_state();
    DynamicState closed = state.value_or(DynamicState{});
    if (state && state->status == DynamicState::Status::kClosed) break;
    closed.status = DynamicState::Status::kClosed;
    Bytes expected = state ? state->encode() : Bytes();
    if (store_->compare_set(key("state"), expected, closed.encode()) == closed.encode()) {
      publish_event(*store_, prefix_, closed.round,
                    {RendezvousEvent::Kind::kShutdownRequested, node_id_, "rendezvous closed"});
      // Wake nodes waiting for the round to complete or for the next one.
      store_->set(round_key(closed.round, "done"), to_bytes("1"));
      store_->set(round_key(closed.round, "superseded"), to_bytes("1"));
      break;
    }
  }
}

bool DynamicRendezvous::is_closed() {
  throw_if_store_lost();
  auto state = read_state();
  return state && state->status == DynamicState::Status::kClosed;
}

void DynamicRendezvous::throw_if_store_lost() const {
  if (auto lost = store_loss_->reason(); !lost.empty()) throw ConnectionError(lost);
}

void DynamicRendezvous::drive_keep_alive_externally() { keep_alive_->drive_externally(); }

bool DynamicRendezvous::keep_alive_step() { return keep_alive_->step(); }

void DynamicRendezvous::shutdown() {
  if (keep_alive_) keep_alive_->stop();
  if (watcher_) watcher_->stop();
}

}  // namespace dlaunch
