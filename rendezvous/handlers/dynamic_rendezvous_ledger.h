// How DynamicRendezvous counts nodes into a round, learns of them, and waits for news: the
// part of the dynamic rendezvous that differs by backend. The state record, its compare_set
// transitions and decide_join (dynamic_rendezvous_state.h) are the same for all, so the
// semantics (MIN:MAX, last call, late arrivals wait for the next round, rank hints) are too.
//
//   StoreRoundLedger (store_ledger.h, c10d): an atomic add on "round/<r>/arrivals" gives the
//     arrival index, the descriptor goes under "round/<r>/node/<index>", and waiting nodes
//     sleep on wake-up keys and re-read the counter. Cheap on the TCP store, whose add is one
//     request.
//   EtcdRoundLedger (etcd_ledger.h): on etcd an add is read-then-compare-and-swap: 64 nodes
//     joining at once retry it about 17 times each, and 64 pollers saturate etcd's gateway
//     (bench/etcd). One join key per node in one transaction, and one watch instead.
//
// The contract a ledger keeps, for round r:
//   - join() gives each node a distinct 1-based arrival index; indices are dense and ordered
//     the way the nodes joined, and never change (a node that dies keeps its index);
//   - arrivals() is the number of joins so far (a count no smaller than any index handed out
//     before the call began);
//   - described(r, n, ...) are the descriptors of arrivals 1..n in index order.
// Ledgers are used from next_rendezvous()'s thread, and arrivals() also from whichever thread
// calls num_nodes_waiting(): implementations must be thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "rendezvous/handlers/dynamic_rendezvous_state.h"
#include "rendezvous/store/store.h"

namespace dlaunch {

class RoundLedger {
 public:
  virtual ~RoundLedger() = default;

  // Adds this node to `round`; returns its arrival index. Called once per node and round.
  // Blocks for one or two store round trips; throws the store's errors.
  virtual int64_t join(int64_t round, const NodeDescriptor& me) = 0;

  struct Count {
    int64_t arrivals = 0;
    TimePoint changed_at{};  // when this node learnt of the latest arrival (last call)
  };
  // The arrivals of `round` so far. Non-blocking apart from one store round trip at most.
  virtual Count arrivals(int64_t round, TimePoint now) = 0;

  struct Described {
    std::vector<NodeDescriptor> nodes;  // in arrival order
    std::vector<int64_t> indexes;       // their arrival indexes
  };
  // Descriptors of arrivals 1..n of `round` in index order. An arrival counted but not yet
  // described (the store ledger's join is two requests) is waited for until `wait_until`, then
  // left out: its node died while joining. Throws StateError when arrivals are missing that a
  // ledger with an atomic join (etcd) must have (the run's keys were deleted).
  virtual Described described(int64_t round, int64_t n, TimePoint wait_until) = 0;

  // Keys below are store keys under the round's prefix, "<rendezvous prefix>/round/<r>/".
  //
  // Blocks until something may change the join decision for `round` (which this node joined):
  // `wake_key` (e.g. ".../round/3/done") was set, or, when `limits` is given (a node waiting
  // for its round to complete), the arrivals reached limits->max_nodes, or they reached
  // limits->min_nodes and none came for limits->last_call_timeout; or until `until`. A node
  // waiting for the next round passes nullptr: arrivals do not concern it (there are more than
  // MAX of them already when the round is full). It may return earlier (the store ledger sleeps
  // one poll slice): the caller reads the state and decides again either way. Never throws
  // TimeoutError: the caller decides.
  virtual void wait(int64_t round, const std::string& wake_key, const DynamicLimits* limits,
                    TimePoint until) = 0;

  // What wait_fetching read: the keys' values, whether keys[0] was set, and the arrivals.
  struct Fetched {
    WaitGetResult got;
    Count arrivals;
  };
  // wait() for a node waiting in the round it joined, where keys[0] is the wake key: reads, as
  // the wait ends (woken or not), the value of each of `keys` and the round's arrivals, so the
  // node decides again without reading them (the store ledger: one WAIT_GET that the server
  // answers at the end of the slice, Store::wait_get). nullopt: nothing was read (the default,
  // which only waits; and a slice that was over before it began).
  virtual std::optional<Fetched> wait_fetching(int64_t round, const std::vector<std::string>& keys,
                                               const DynamicLimits* limits, TimePoint until) {
    wait(round, keys.at(0), limits, until);
    return std::nullopt;
  }

  // Blocks until `key` is set, and returns its value; throws TimeoutError at `deadline`.
  virtual Bytes wait_key(int64_t round, const std::string& key, TimePoint deadline) = 0;
  // wait_key(round, keys[0], deadline), reading the other keys with it where the backend can
  // (the store ledger: one WAIT_GET). Returns each key's value (nullopt: missing, or not read:
  // the default reads only keys[0]).
  virtual std::vector<std::optional<Bytes>> wait_key_fetching(int64_t round,
                                                              const std::vector<std::string>& keys,
                                                              TimePoint deadline) {
    std::vector<std::optional<Bytes>> values(keys.size());
    values.at(0) = wait_key(round, keys[0], deadline);
    return values;
  }
};

// "<prefix>/round/<round>/<suffix>": the keys of one round, in every ledger's layout.
inline std::string ledger_round_key(const std::string& prefix, int64_t round,
                                    const std::string& suffix) {
  return prefix + "/round/" + std::to_string(round) + "/" + suffix;
}

}  // namespace dlaunch
