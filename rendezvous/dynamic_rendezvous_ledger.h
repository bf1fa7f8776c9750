// An optional hook of DynamicRendezvous: how nodes count themselves into a round, learn of each
// other, and wait for news. Without one (the c10d backend) the rendezvous uses the store as
// dynamic_rendezvous_state.h describes: an atomic add on "round/<r>/arrivals" gives the arrival
// index, the descriptor goes under "round/<r>/node/<index>", and waiting nodes re-read the
// counter every poll interval. That is cheap on the TCP store, whose add is one request, but on
// etcd an add is read-then-compare-and-swap: 64 nodes joining at once retry it about 17 times
// each, and 64 pollers saturate etcd's gateway (bench/etcd). A ledger replaces those three
// things; the state record, its compare_set transitions and decide_join stay as they are, so
// the semantics (MIN:MAX, last call, late arrivals wait for the next round, rank hints) do not
// change. etcd's ledger is rendezvous/etcd_ledger.h.
//
// The contract a ledger keeps, for round r:
//   - join() gives each node a distinct 1-based arrival index; indices are dense and ordered
//     the way the nodes joined, and never change (a node that dies keeps its index);
//   - arrivals() is the number of joins so far (a count no smaller than any index handed out
//     before the call began);
//   - participants(r, n) are the descriptors of arrivals 1..n in index order.
// Ledgers are used from next_rendezvous()'s thread, and arrivals() also from whichever thread
// calls num_nodes_waiting(): implementations must be thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"
#include "rendezvous/dynamic_rendezvous_state.h"

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

  // Descriptors of arrivals 1..n in index order. Throws StateError when fewer exist.
  virtual std::vector<NodeDescriptor> participants(int64_t round, int64_t n) = 0;

  // Keys below are store keys under the round's prefix, "<rendezvous prefix>/round/<r>/".
  //
  // Blocks until something may change the join decision for `round` (which this node joined):
  // `wake_key` (e.g. ".../round/3/done") was set, or, when `limits` is given (a node waiting
  // for its round to complete), the arrivals reached limits->max_nodes, or they reached
  // limits->min_nodes and none came for limits->last_call_timeout; or until `until`. A node
  // waiting for the next round passes nullptr: arrivals do not concern it (there are more than
  // MAX of them already when the round is full). Never throws TimeoutError: the caller decides.
  virtual void wait(int64_t round, const std::string& wake_key, const DynamicLimits* limits,
                    TimePoint until) = 0;

  // Blocks until `key` is set, and returns its value; throws TimeoutError at `deadline`.
  virtual Bytes wait_key(int64_t round, const std::string& key, TimePoint deadline) = 0;
};

}  // namespace dlaunch
