#include "rendezvous/handlers/failure_verdicts.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/handlers/dynamic_rendezvous_ledger.h"

namespace dlaunch {

FailureVerdicts::FailureVerdicts(Settings settings, std::shared_ptr<Store> store,
                                 const StoreLoss& loss, const Clock& clock)
    : settings_(std::move(settings)), store_(std::move(store)), loss_(loss), clock_(clock) {}

std::string FailureVerdicts::round_key(int64_t round, const std::string& suffix) const {
  return ledger_round_key(settings_.prefix, round, suffix);
}

void FailureVerdicts::enter_round(int64_t round, int64_t nodes) {
  std::lock_guard<std::mutex> lock(mutex_);
  round_ = round;
  nodes_ = nodes;
}

void FailureVerdicts::begin_leaving() {
  std::lock_guard<std::mutex> lock(mutex_);
  leaving_ = true;
}

void FailureVerdicts::ack() {
  if (auto lost = loss_.reason(); !lost.empty()) throw ConnectionError(lost);
  int64_t round, n;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // A leaving node's count would make its own leaving, which fails the others' workers,
    // a failure of theirs that spends the budget.
    if (leaving_ || round_ < 0 || acked_round_ == round_) return;
    round = round_;
    n = nodes_;
    // Claimed before the add: the watcher (a restart event) and the failure report may ack at
    // the same time, and a node counted twice would pass for a dead one's ack. Not retried when
    // the add fails (it may have counted): a missing ack only delays the verdict.
    acked_round_ = round;
  }
  int64_t acks = store_->add(round_key(round, "acks"), 1);
  // Every participant is alive and saw the failure: a real worker failure.
  if (acks == n) write(*store_, round, "C");
}

bool FailureVerdicts::write(Store& store, int64_t round, const std::string& verdict) {
  // compare_set returns the value now stored: two writers of the same text would both see
  // their own value and both count as the first. The writer's node id makes each value unique.
  // But this node may try twice (its ack completed the count, then its settle passed its
  // deadline under load before it saw the verdict, or two of its threads at once): it would
  // see its own value again and charge the budget twice. So its tries are one at a time, and a
  // round it already wrote is not written again.
  std::lock_guard<std::mutex> lock(verdict_mutex_);
  if (round <= verdict_round_) return false;
  Bytes mine = to_bytes(verdict + "|" + settings_.node_id);
  if (store.compare_set(round_key(round, "verdict"), Bytes(), mine) != mine) return false;
  verdict_round_ = round;
  // Exactly one writer per round: the one that charges the job-wide budget.
  if (verdict == "C") store.add(settings_.prefix + "/restart_count", 1);
  return true;
}

FailureVerdict FailureVerdicts::settle() {
  int64_t round;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    round = round_;
  }
  DL_CHECK(round >= 0) << "settle_failure() before next_rendezvous()";
  const auto window = settings_.keep_alive_interval * settings_.keep_alive_max_attempt;
  // The keep-alive observer of a dead node rules within the window of the node's last beat
  // (plus its check period); past that, with no verdict, the failure is charged.
  const auto budget = window + 2 * settings_.keep_alive_interval;
  auto deadline = clock_.now() + budget;
  bool acked = false;
  // While the store does not answer, nobody can rule: no lease runs out in an etcd that is
  // down (it gives every lease a full TTL again when it is back, after electing a leader), and
  // the observers' keep-alive waits too. So an outage does not use up the budget: once the store
  // answers again, the verdict gets a budget from then, twice the usual (the lease's new TTL
  // after the election, and the observer's fresh look at the node), before it is charged.
  bool silent = false;
  while (true) {
    if (auto lost = loss_.reason(); !lost.empty()) {
      return {FailureVerdict::Kind::kStoreLost, lost};
    }
    try {
      if (silent) {
        store_->check({round_key(round, "verdict")});  // answers, or throws again
        silent = false;
        deadline = std::max(deadline, clock_.now() + 2 * budget);
        log_debug(
            "rendezvous {}: the store answers again; the failure's verdict is awaited "
            "until {:.1f} s from now",
            settings_.run_id, to_seconds(deadline - clock_.now()));
      }
      if (auto verdict = look(round, deadline, acked)) return *verdict;
      continue;
    } catch (const ClosedError& e) {
      silent = true;
      log_debug("rendezvous {}: settling the failure: {}", settings_.run_id, e.what());
    } catch (const ConnectionError& e) {
      silent = true;
      log_debug("rendezvous {}: settling the failure: {}", settings_.run_id, e.what());
    } catch (const TimeoutError& e) {  // a call etcd did not answer in time (a partition)
      silent = true;
      log_debug("rendezvous {}: settling the failure: {}", settings_.run_id, e.what());
    }
    loss_.wait_for(std::chrono::milliseconds(200));
  }
}

bool FailureVerdicts::node_lost_now() {
  int64_t round;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    round = round_;
  }
  if (round < 0) return false;
  const std::string verdict_key = round_key(round, "verdict");
  if (!store_->check({verdict_key})) return false;
  const std::string v = to_string(store_->get(verdict_key));
  return v.size() > 2 && v[0] == 'L';
}

std::optional<FailureVerdict> FailureVerdicts::look(int64_t round, TimePoint deadline,
                                                    bool& acked) {
  if (!acked) {
    ack();
    acked = true;
  }
  auto now = clock_.now();
  if (now >= deadline) write(*store_, round, "C");
  Duration slice = std::clamp<Duration>(deadline - now, std::chrono::milliseconds(1),
                                        std::chrono::milliseconds(500));
  const std::string verdict_key = round_key(round, "verdict");
  try {
    store_->wait({verdict_key}, slice);
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
  std::string v = to_string(store_->get(verdict_key));
  if (v.size() > 2 && v[0] == 'L') {  // "L|<reason>|<writer's node id>"
    return FailureVerdict{FailureVerdict::Kind::kNodeLost, v.substr(2, v.rfind('|') - 2)};
  }
  return FailureVerdict{FailureVerdict::Kind::kCharged, ""};
}

}  // namespace dlaunch
