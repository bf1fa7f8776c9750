// The release of a dynamic round that formed (dynamic_rendezvous.h), once the state record says
// COMPLETE(r, n): the closing node reads the N descriptors once and writes what each node needs
// (round_table.h), then the workers' namespace, then round/<r>/done; every other node waits for
// "done" and reads its place in one request. A closer that died before releasing costs at most
// the keep-alive window: the first node to claim the takeover releases the round instead (the
// same table: assign_ranks is a function of the descriptors).
//
// Keys, under the rendezvous prefix:
//   round/<r>/done                  "2": released with the table; "reopened": given up for too
//                                   few live nodes, OPEN(r+1) is there; "1": an older closer,
//                                   which writes no table (every node reads all descriptors)
//   round/<r>/takeover              the claim of the node that releases for a dead closer
//   tables/<r>/table, /assign/<i>   the round's table and arrival i's rank; outside round/<r>/:
//                                   etcd's ledger watches that prefix, and N assignments there
//                                   would be N watch events for every node
//   restart_count                   read with the table, so the closer makes sure it exists
//
// Blocking: release() and wait() take store round trips, wait() up to the join deadline.
// Errors: the store's; TimeoutError when nobody released the round by the deadline;
// ProtocolError for records this build cannot read.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "rendezvous/handlers/dynamic_rendezvous_ledger.h"
#include "rendezvous/handlers/dynamic_rendezvous_state.h"
#include "rendezvous/handlers/round_table.h"
#include "rendezvous/store/store.h"

namespace dlaunch {

class RoundRelease {
 public:
  struct Settings {
    std::string run_id;     // for messages and the workers' namespace
    std::string prefix;     // the rendezvous' keys ("dlaunch/rdzv/<run_id>")
    int64_t min_nodes = 1;  // --nnodes MIN
    // interval x max_attempt: how long a node that counted itself in may take to describe
    // itself, and a closer to release the round, before the others go on without it.
    Duration keep_alive_window = std::chrono::seconds(15);
  };
  // A node's place in a released round: the closer's table and the node's assignment, else
  // computed from every descriptor (an older closer).
  struct Place {
    RoundTable table;
    RankAssignment me;           // rank -1: the round formed without this node
    int64_t restart_count = -1;  // -1: not read yet
  };

  RoundRelease(Settings settings, std::shared_ptr<Store> store, std::shared_ptr<RoundLedger> ledger,
               const Clock& clock);

  // What round/<r>/done says.
  static bool released_with_table(const Bytes& done);
  static bool reopened(const Bytes& done);

  // The closer's (or the takeover's) share after COMPLETE(r, n): the table, the workers'
  // namespace, then "done"; or, with fewer than MIN live participants, OPEN(r+1) and "done"
  // saying so.
  void release(const DynamicState& complete, TimePoint deadline);
  // Blocks until the round is released ("done"); returns the values of place_keys() (at least
  // "done"'s: the ledger may read the others with it, wait_key_fetching). Takes over the release
  // when the closer did not within the keep-alive window.
  std::vector<std::optional<Bytes>> wait(const DynamicState& state, int64_t arrival_index,
                                         TimePoint deadline);
  // "done", the table, arrival `arrival_index`'s assignment and restart_count of `round`: what
  // a released round's node reads (the last three from a closer that wrote the table).
  std::vector<std::string> place_keys(int64_t round, int64_t arrival_index) const;
  // The place from the values of the last three place_keys().
  Place decode_place(const Bytes& table, const Bytes& me, const Bytes& restart_count) const;
  // `released`: the values of place_keys() as wait() read them ("done" at least).
  Place read_place(const DynamicState& state, int64_t arrival_index,
                   const std::vector<std::optional<Bytes>>& released, TimePoint deadline);

 private:
  std::string round_key(int64_t round, const std::string& suffix) const {
    return ledger_round_key(settings_.prefix, round, suffix);
  }
  std::string table_key(int64_t round, const std::string& suffix) const {
    return settings_.prefix + "/tables/" + std::to_string(round) + "/" + suffix;
  }
  // Descriptors of arrivals 1..n of `round` (O(N): the closing node only); waits for missing
  // ones until `wait_until`, then leaves them out, saying so.
  RoundLedger::Described read_participants(int64_t round, int64_t n, TimePoint wait_until);
  // The closing node's share: the round's table and every node's assignment (round_table.h).
  // False (nothing written) when fewer than MIN participants described themselves.
  bool publish_table(int64_t round, int64_t n, TimePoint deadline);
  void begin_worker_namespace(int64_t round);

  Settings settings_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<RoundLedger> ledger_;
  const Clock& clock_;
};

}  // namespace dlaunch
