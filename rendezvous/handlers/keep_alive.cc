#include "rendezvous/handlers/keep_alive.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/handlers/rendezvous_events.h"

namespace dlaunch {

namespace {
// A part of `d` in [0, d) drawn from `salt` (a node id holds a random nonce): spreads what N
// agents started together would otherwise do in the same instant.
Duration share_of(Duration d, const std::string& salt) {
  return d * static_cast<int64_t>(std::hash<std::string>{}(salt) % 1000) / 1000;
}
}  // namespace

KeepAlive::KeepAlive(Settings settings, std::function<std::shared_ptr<Store>()> open_store,
                     MakeLiveness make_liveness, FailureVerdicts& verdicts, StoreLoss& loss,
                     const Clock& clock)
    : settings_(std::move(settings)),
      open_store_(std::move(open_store)),
      make_liveness_(std::move(make_liveness)),
      verdicts_(verdicts),
      loss_(loss),
      clock_(clock) {}

// How long a neighbour whose store connection ended has to connect again (or beat) before it
// is lost. A live agent whose connection merely broke notices at its next call, at most a step
// (interval / 4) later, reconnects 50 ms after that, and registers its will again at once
// (use_connection_wills, which counts the new connection): half an interval leaves it a whole
// step more than that. A dead one is found about a grace and a step after it died, a fraction
// of the window. The floor keeps the same margin for the shortest intervals, whose step is
// 50 ms.
Duration KeepAlive::close_grace() const {
  return std::max<Duration>(settings_.interval / 2, std::chrono::milliseconds(250));
}

KeepAlive::~KeepAlive() {
  stop();
}

void KeepAlive::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (thread_.joinable() || stopping_ || external_) return;
  thread_ = std::thread([this] { loop(); });
}

void KeepAlive::loop() {
  // Beat once per interval, but look at the neighbours four times as often: a silent node is
  // then reported within a quarter interval of its window passing, not up to a whole one.
  Duration tick = std::max<Duration>(settings_.interval / 4, std::chrono::milliseconds(50));
  // Agents of a job start together; unstaggered, N of them would beat and look at their
  // neighbours in the same instant every tick. The first step runs at once; the next one
  // after a fraction of a tick drawn from the node id (random per agent process).
  bool first = true;
  while (step()) {
    Duration wait = tick;
    if (first) {
      first = false;
      wait = tick + share_of(tick, settings_.node_id + "/tick");
    }
    if (std::exchange(state_.look_again_now, false)) {
      wait = std::min<Duration>(wait, std::chrono::milliseconds(50));
    }
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait_for(lock, wait, [&] { return stopping_ || leave_requested_; });
  }
  finish();
}

void KeepAlive::drive_externally() {
  std::lock_guard<std::mutex> lock(mutex_);
  DL_CHECK(!thread_.joinable()) << "drive_keep_alive_externally() after the first round";
  external_ = true;
}

void KeepAlive::watch_round(int64_t round, int64_t nodes, int64_t rank,
                            std::vector<NodeRef> watched) {
  std::lock_guard<std::mutex> lock(mutex_);
  round_ = round;
  nodes_ = nodes;
  rank_ = rank;
  watched_ = std::move(watched);
}

void KeepAlive::begin_leaving() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (leaving_ || stopping_) return;
    leaving_ = true;
    leave_requested_ = true;
    // Under the lock: no failure of this node counts once the step can announce the leave.
    verdicts_.begin_leaving();
  }
  wake_.notify_all();
}

std::vector<NodeRef> KeepAlive::watched_nodes(int64_t reported_round) {
  if (round_ < 0 || round_ == reported_round) return {};
  return watched_;
}

bool KeepAlive::step() {
  auto& ka = state_;
  int64_t round;
  std::vector<NodeRef> watched;
  bool announce_leaving_now;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_) return false;
    leave_requested_ = false;
    announce_leaving_now = leaving_ && round_ >= 0 && leave_announced_round_ != round_;
    if (!loss_.reason().empty()) {
      if (external_) return false;
      wake_.wait(lock, [&] { return stopping_; });
      return false;
    }
    if (!ka.started) {
      ka.started = true;
      ka.last_contact = clock_.now();
    }
    round = round_;
    watched = watched_nodes(ka.reported_round);
  }
  // Nothing may escape: on the keep-alive thread an exception would end the agent
  // (std::terminate) without a word. A store error is retried; anything else is reported and
  // retried the same way (meanwhile this node cannot prove it is alive, and the others see it).
  try {
    ka.doing = "connecting to the store";
    if (!ka.store) {
      if (!open_store()) return false;
      ka.doing = "registering this node's last will with the store";
      ka.liveness->use_connection_wills(close_grace());
      ka.beat_now = true;  // the others see a node that reconnected at once
    }
    if (round != ka.looked_round) {
      // The round's nodes all joined it, so they were alive when it formed: a neighbour's
      // silence before does not carry over. Carried over, a node whose link was cut for a
      // moment and that is back in time to join the re-formed round (while its keep-alive still
      // waits out TCP's retransmissions) would be reported again at the first look, and every
      // re-form would bring the next.
      ka.liveness->restart_windows();
      ka.looked_round = round;
    }
    ka.doing = "sending this node's keep-alive";
    beat_when_due();
    if (announce_leaving_now) {
      ka.doing = "telling the other nodes that this node leaves";
      announce_leaving(*ka.store);  // retried at the next step if the store does not answer
    }
    if (!watched.empty()) report_lost_neighbours(watched, round);
    store_answered();
  } catch (const StoreRefusedError& e) {
    return failed(e.what(), false, StoreFailure::kRefused);
  } catch (const StoreInterruptedError& e) {
    return failed(e.what(), false);
  } catch (const ClosedError& e) {
    return failed(e.what(), false, StoreFailure::kClosed);
  } catch (const Error& e) {
    return failed(e.what(), false);
  } catch (const std::exception& e) {
    return failed(e.what(), true);
  } catch (...) {
    return failed("an exception of unknown type", true);
  }
  return true;
}

bool KeepAlive::open_store() {
  auto& ka = state_;
  ka.store = open_store_();
  ka.liveness = make_liveness_(ka.store);
  std::lock_guard<std::mutex> lock(mutex_);
  store_ = ka.store;
  return !stopping_;
}

void KeepAlive::beat_when_due() {
  auto& ka = state_;
  auto now = clock_.now();
  if (ka.beaten && !ka.beat_now && now - ka.last_beat < settings_.interval) return;
  ka.liveness->beat();
  ka.beat_now = false;
  // The second beat comes up to one interval early, at a phase drawn from the node id, so the
  // beats of N agents started together spread over the interval (never later: the window is
  // counted from the last beat).
  Duration early =
      ka.beaten ? Duration::zero() : share_of(settings_.interval, settings_.node_id + "/beat");
  ka.last_beat = now - early;
  ka.beaten = true;
}

void KeepAlive::report_lost_neighbours(const std::vector<NodeRef>& watched, int64_t round) {
  auto& ka = state_;
  std::vector<std::string> ids;
  std::string neighbours;
  for (const auto& w : watched) {
    ids.push_back(w.id);
    neighbours +=
        fmt::format("{}node {} (node rank {})", neighbours.empty() ? "" : ", ", w.host, w.rank);
  }
  ka.doing = "reading the keep-alives of the nodes this node watches: " + neighbours;
  auto dead = ka.liveness->dead(ids);
  if (dead.empty()) return;
  // Those whose agent's connection ended apart from those silent for the window: each group
  // is said what happened to it.
  std::string ended, silent;
  for (const auto& w : watched) {
    if (std::find(dead.begin(), dead.end(), w.id) == dead.end()) continue;
    std::string& who = ka.liveness->found_by_connection_end(w.id) ? ended : silent;
    who += fmt::format("{}node {} (node rank {})", who.empty() ? "" : ", ", w.host, w.rank);
  }
  std::string reason;
  if (!ended.empty()) {
    reason = fmt::format(
        "{} lost (its agent's store connection closed and no keep-alive came for {:g} s)", ended,
        to_seconds(close_grace()));
  }
  if (!silent.empty()) {
    reason += fmt::format("{}{} lost (no keep-alive for {:g} s)", reason.empty() ? "" : "; ",
                          silent, to_seconds(window()));
  }
  log_warning("rendezvous '{}' round {}: {}", settings_.run_id, round, reason);
  ka.doing = "telling the other nodes: " + reason;
  // The verdict first: nodes whose workers already failed wait for it (settle_failure).
  verdicts_.write(*ka.store, round, "L|" + reason);
  publish_event(*ka.store, settings_.prefix, round,
                {RendezvousEvent::Kind::kMembershipChanged, settings_.node_id, reason});
  ka.reported_round = round;
}

void KeepAlive::store_answered() {
  auto& ka = state_;
  auto silent = clock_.now() - ka.last_contact;
  ka.last_contact = clock_.now();
  if (ka.in_trouble) {
    log_info("rendezvous keep-alive: {}{} reachable again after {:.1f} s",
             settings_.store_dies_with_host ? "the store at " : "etcd at ", settings_.endpoint,
             to_seconds(silent));
    ka.in_trouble = false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  healthy_ = true;
}

bool KeepAlive::failed(const std::string& what, bool unexpected, StoreFailure failure) {
  auto& ka = state_;
  ka.store.reset();
  ka.liveness.reset();
  auto now = clock_.now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    store_.reset();
    healthy_ = false;
    if (stopping_) return false;  // stop() interrupted the call
  }
  if (unexpected) {
    // Not a store error: a defect. Said every time, not once, so it is not missed.
    log_error(
        "rendezvous keep-alive: unexpected error ({}); this is a bug in dlaunch, please "
        "report it; retrying",
        what);
  } else if (!ka.in_trouble) {
    log_warning("rendezvous keep-alive of node {} ({}): {}; retrying{}", settings_.host, ka.doing,
                what,
                settings_.store_dies_with_host
                    ? fmt::format(" (the store counts as lost after {:g} s without an answer, "
                                  "or at once when nothing listens on its port)",
                                  to_seconds(window()))
                    : std::string(" quietly until it answers"));
  } else {
    log_debug("rendezvous keep-alive: {}; retrying", what);
  }
  ka.in_trouble = true;
  ka.look_again_now = failure == StoreFailure::kClosed;
  if (!settings_.store_dies_with_host) return true;
  if (failure == StoreFailure::kRefused) {
    declare_store_lost(now - ka.last_contact, true);
  } else if (now - ka.last_contact >= window()) {
    declare_store_lost(now - ka.last_contact, false);
  }
  return true;
}

void KeepAlive::declare_store_lost(Duration silent, bool refused) {
  const std::string what =
      refused ? fmt::format(
                    "closed its connection and refuses new ones ({:.1f} s since it last "
                    "answered): it died",
                    to_seconds(silent))
              : fmt::format("has not answered for {:.1f} s: it died or was cut off",
                            to_seconds(silent));
  // Silence says less than a refusal: this node may be the one cut off, and the others may
  // have re-formed and trained on without it. Say only what this node knows.
  loss_.declare(
      refused ? fmt::format(
                    "the agent hosting the c10d store at {} (--rdzv_endpoint) {}, and since that "
                    "store is the job's single point of failure the job cannot go on; start it "
                    "again, or use --rdzv_backend etcd, whose store outlives any agent",
                    settings_.endpoint, what)
              : fmt::format(
                    "the agent hosting the c10d store at {} (--rdzv_endpoint) {}; this node "
                    "leaves the job. If that agent died, the job cannot go on (its store is the "
                    "job's single point of failure): start it again, or use --rdzv_backend etcd, "
                    "whose store outlives any agent; if only this node was cut off, the job may "
                    "go on without it",
                    settings_.endpoint, what));
}

void KeepAlive::finish() {
  auto& ka = state_;
  bool healthy;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    healthy = healthy_ && loss_.reason().empty();
  }
  // A store that does not answer cannot be told; the others' keep-alive reports this node.
  if (ka.liveness && healthy) {
    try {
      ka.liveness->leave();
      announce_leaving(*ka.store);
    } catch (const Error& e) {
      log_debug("rendezvous keep-alive: could not mark this node as left: {}", e.what());
    }
  }
  ka.liveness.reset();
  ka.store.reset();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    store_.reset();
    exited_ = true;
  }
  wake_.notify_all();
}

void KeepAlive::announce_leaving(Store& store) {
  int64_t round, rank;
  size_t nodes;
  bool on_stop_signal;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    round = round_;
    rank = rank_;
    nodes = static_cast<size_t>(nodes_);
    on_stop_signal = leaving_;
    if (round == leave_announced_round_) return;  // begin_leaving() did, stop() need not
  }
  if (round < 0 || nodes < 2) return;
  // A node stopped while its round runs (SIGTERM to one agent: a scale-down) is a membership
  // change for the others, not their failure: the verdict lets the failures their workers see
  // next be settled free at once, instead of charged when no keep-alive verdict comes (a node
  // that left is not reported as lost). After a success every node has passed the exit
  // barrier, and after a failure the rendezvous is closed or the verdict already written: the
  // event is ignored then, and the first verdict of a round holds.
  std::string reason = fmt::format("node {} (node rank {}) left", settings_.host, rank);
  verdicts_.write(store, round, "L|" + reason);
  publish_event(store, settings_.prefix, round,
                {RendezvousEvent::Kind::kMembershipChanged, settings_.node_id, reason});
  {
    std::lock_guard<std::mutex> lock(mutex_);
    leave_announced_round_ = round;
  }
  if (on_stop_signal) {
    log_info(
        "rendezvous '{}' round {}: told the other {} node(s) that this node leaves; they "
        "re-form without it (not counted as a restart)",
        settings_.run_id, round, nodes - 1);
  }
}

void KeepAlive::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) {
    // A healthy thread finishes its call and marks this node as left (etcd: revokes its lease)
    // within a round trip or two; one retrying a dead store is interrupted at once (repeatedly:
    // it may be between calls). Either way well within the agent's shutdown grace.
    auto patience = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (true) {
      std::shared_ptr<Store> store;
      bool healthy;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        store = store_;
        healthy = healthy_ && loss_.reason().empty();
      }
      if (store && (!healthy || std::chrono::steady_clock::now() >= patience)) store->interrupt();
      std::unique_lock<std::mutex> lock(mutex_);
      if (wake_.wait_for(lock, std::chrono::milliseconds(10), [&] { return exited_; })) break;
    }
    thread_.join();
  } else if (external_) {
    bool finished;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      finished = exited_;
    }
    if (!finished) finish();
  }
}

}  // namespace dlaunch
