#include "rendezvous/handlers/round_release.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/tcp/worker_namespace.h"

namespace dlaunch {

namespace {
// The value of round/<r>/done when the closer wrote the round's table (round_table.h); an
// older build writes "1" and no table.
const std::string kDoneWithTable = "2";
// The value of round/<r>/done when the round was given up for too few live nodes and the
// next one opened instead (release).
const std::string kDoneReopened = "reopened";
}  // namespace

RoundRelease::RoundRelease(Settings settings, std::shared_ptr<Store> store,
                           std::shared_ptr<RoundLedger> ledger, const Clock& clock)
    : settings_(std::move(settings)),
      store_(std::move(store)),
      ledger_(std::move(ledger)),
      clock_(clock) {}

bool RoundRelease::released_with_table(const Bytes& done) {
  return done == to_bytes(kDoneWithTable);
}

bool RoundRelease::reopened(const Bytes& done) {
  return done == to_bytes(kDoneReopened);
}

void RoundRelease::begin_worker_namespace(int64_t round) {
  // Workers meet in this store when it is a dlaunch TCP store (the only kind that scopes their
  // keys); etcd's workers meet in the group-rank-0 agent's TCP store (etcd_rendezvous.cc), and
  // an in-memory store (tests) has no workers.
  dlaunch::begin_worker_namespace(*store_, worker_namespace(settings_.run_id, round));
}

RoundLedger::Described RoundRelease::read_participants(int64_t round, int64_t n,
                                                       TimePoint wait_until) {
  auto arrivals = ledger_->described(round, n, wait_until);
  if (static_cast<int64_t>(arrivals.nodes.size()) < n) {
    log_warning(
        "rendezvous '{}' round {}: {} of {} node(s) counted themselves in but never "
        "described themselves within the keep-alive window (they died while joining); "
        "the round goes on without them",
        settings_.run_id, round, n - static_cast<int64_t>(arrivals.nodes.size()), n);
  }
  return arrivals;
}

void RoundRelease::release(const DynamicState& complete, TimePoint deadline) {
  const int64_t round = complete.round;
  // This node closed the round: it reads the N descriptors once and writes what each node
  // needs, so nobody else reads them (round_table.h).
  if (!publish_table(round, complete.participants, deadline)) {
    // Nodes that never described themselves left fewer than MIN: no round with these nodes.
    // Open the next one and tell the participants to join it.
    DynamicState next{round + 1, DynamicState::Status::kOpen, 0};
    store_->compare_set(settings_.prefix + "/state", complete.encode(), next.encode());
    store_->set(round_key(round, "superseded"), to_bytes("1"));
    store_->set(round_key(round, "done"), to_bytes(kDoneReopened));
    return;
  }
  // Before anyone is released, so every worker of this round gets its namespace; the previous
  // round's keys go (every participant stopped its workers before joining).
  begin_worker_namespace(round);
  store_->set(round_key(round, "done"), to_bytes(kDoneWithTable));
  log_debug("rendezvous {}: round {} completed with {} nodes", settings_.run_id, round,
            complete.participants);
}

bool RoundRelease::publish_table(int64_t round, int64_t n, TimePoint deadline) {
  // A node that counted itself in and died before describing itself costs at most the
  // keep-alive window, not the join timeout: the round goes on without it.
  auto wait_until = std::min(deadline, clock_.now() + settings_.keep_alive_window);
  auto arrivals = read_participants(round, n, wait_until);
  if (static_cast<int64_t>(arrivals.nodes.size()) < settings_.min_nodes) {
    log_warning(
        "rendezvous '{}' round {}: only {} of its {} node(s) described themselves, fewer "
        "than --nnodes MIN={}; opening the next round for them",
        settings_.run_id, round, arrivals.nodes.size(), n, settings_.min_nodes);
    return false;
  }
  auto by_rank = assign_ranks(arrivals.nodes);
  auto assignments = RankAssignment::make(arrivals.nodes, by_rank);
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  keys.reserve(n + 1);
  values.reserve(n + 1);
  size_t next = 0;
  for (int64_t index = 1; index <= n; ++index) {
    keys.push_back(table_key(round, fmt::format("assign/{}", index)));
    if (next < arrivals.indexes.size() && arrivals.indexes[next] == index) {
      values.push_back(assignments[next++].encode());
    } else {
      values.push_back(RankAssignment{}.encode());  // rank -1: not in this round
    }
  }
  keys.push_back(table_key(round, "table"));
  values.push_back(RoundTable::make(arrivals.nodes, by_rank).encode());
  store_->multi_set(keys, values);
  // Read with the table in one request by every node (finish_round), so it must exist.
  store_->add(settings_.prefix + "/restart_count", 0);
  return true;
}

std::vector<std::optional<Bytes>> RoundRelease::wait(const DynamicState& state,
                                                     int64_t arrival_index, TimePoint deadline) {
  const auto keys = place_keys(state.round, arrival_index);
  while (true) {
    // The closer publishes the table and sets "done" within moments. One that died between
    // fixing the round and releasing it costs at most the keep-alive window: then the first
    // node to claim the takeover does the closer's work (the same table: assign_ranks is a
    // function of the descriptors), instead of everyone waiting for the join timeout.
    auto now = clock_.now();
    auto until = std::min(deadline, now + settings_.keep_alive_window);
    try {
      return ledger_->wait_key_fetching(state.round, keys, until);
    } catch (const TimeoutError&) {
      if (clock_.now() >= deadline) {
        throw TimeoutError(fmt::format(
            "rendezvous '{}' round {} was marked complete but nobody released it within the "
            "join timeout; start again",
            settings_.run_id, state.round));
      }
    }
    if (store_->add(round_key(state.round, "takeover"), 1) == 1) {
      log_warning(
          "rendezvous '{}' round {}: the node that closed the round did not release it "
          "within the keep-alive window (it died); this node releases it",
          settings_.run_id, state.round);
      release(state, deadline);
    }
  }
}

std::vector<std::string> RoundRelease::place_keys(int64_t round, int64_t arrival_index) const {
  return {round_key(round, "done"), table_key(round, "table"),
          table_key(round, fmt::format("assign/{}", arrival_index)),
          settings_.prefix + "/restart_count"};
}

RoundRelease::Place RoundRelease::decode_place(const Bytes& table, const Bytes& me,
                                               const Bytes& restart_count) const {
  Place place;
  place.table = RoundTable::decode(table);
  place.me = RankAssignment::decode(me);
  try {
    place.restart_count = std::stoll(to_string(restart_count));
  } catch (const std::logic_error&) {
    throw ProtocolError(fmt::format("rendezvous '{}': restart_count holds '{}', not a count",
                                    settings_.run_id, to_string(restart_count)));
  }
  return place;
}

RoundRelease::Place RoundRelease::read_place(const DynamicState& state, int64_t arrival_index,
                                             const std::vector<std::optional<Bytes>>& released,
                                             TimePoint deadline) {
  if (released[0] == to_bytes(kDoneWithTable)) {
    if (released[1] && released[2] && released[3]) {  // read with "done" (wait_key_fetching)
      return decode_place(*released[1], *released[2], *released[3]);
    }
    // Three small keys in one request, whatever the round's size (round_table.h).
    auto keys = place_keys(state.round, arrival_index);
    auto values = store_->multi_get({keys.begin() + 1, keys.end()});
    return decode_place(values[0], values[1], values[2]);
  }
  // Closed by an agent of an older build, which writes no table: every node reads all.
  Place place;
  auto arrivals = read_participants(state.round, state.participants, deadline);
  auto by_rank = assign_ranks(arrivals.nodes);
  place.table = RoundTable::make(arrivals.nodes, by_rank);
  auto all = RankAssignment::make(arrivals.nodes, by_rank);
  for (size_t i = 0; i < arrivals.indexes.size(); ++i) {
    if (arrivals.indexes[i] == arrival_index) place.me = all[i];
  }
  return place;
}

}  // namespace dlaunch
