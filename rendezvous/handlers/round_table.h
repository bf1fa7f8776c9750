// What the node that closes a dynamic round writes so every other node reads a fixed amount:
// without it each of N nodes read all N descriptors, N^2 bytes through the store
// host per round (2 GB at 4,096 nodes). The closer reads the N descriptors once, assigns the
// ranks (assign_ranks), and writes
//   tables/<r>/table          RoundTable: the round's size, the workers per node as runs, and,
//                             for small rounds, each node's host and build (messages only);
//   tables/<r>/assign/<i>     RankAssignment for arrival i: its group rank, and the nodes its
//                             keep-alive watches (ring neighbours) with their ids and hosts;
// before it sets round/<r>/done, so a node released by "done" reads two small keys in one
// request. Bytes per round: O(N) at the closer, O(1) at every other node (a table of runs is
// one line when every node runs the same number of workers).
//
// Pure codecs: no I/O. Text formats, one field per line, versioned ("v1"), so a later build
// can add lines an older one skips.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/handlers/dynamic_rendezvous_state.h"
#include "rendezvous/store/store.h"

namespace dlaunch {

// A node of a running round as another node's keep-alive names it.
struct NodeRef {
  std::string id;
  std::string host;
  int64_t rank = -1;
  bool operator==(const NodeRef& o) const { return id == o.id && host == o.host && rank == o.rank; }
};

struct RoundTable {
  // Rounds up to this size list every node's host and build; larger ones list the builds with
  // a count, so the table stays small at any scale.
  static constexpr int64_t kNodesListedUpTo = 64;

  int64_t participants = 0;
  // Workers per node by group rank, run-length: (count, local world size).
  std::vector<std::pair<int64_t, int64_t>> worker_runs;
  // By group rank when participants <= kNodesListedUpTo, else empty.
  std::vector<std::string> hosts;
  std::vector<std::string> builds;  // by group rank, as `hosts`
  // When not listed per node: each distinct build and how many nodes run it.
  std::vector<std::pair<std::string, int64_t>> build_counts;

  // The table for `arrivals` (in arrival order) ranked by `by_rank` (assign_ranks).
  static RoundTable make(const std::vector<NodeDescriptor>& arrivals,
                         const std::vector<size_t>& by_rank);
  std::vector<int64_t> local_world_sizes() const;
  // (host, build) pairs for describe_version_mix: per node when listed, else one pair per
  // distinct build named "<k> node(s)".
  std::vector<std::pair<std::string, std::string>> host_builds() const;

  Bytes encode() const;
  static RoundTable decode(const Bytes& value);  // throws ProtocolError
};

struct RankAssignment {
  int64_t rank = -1;
  std::vector<NodeRef> watched;  // watched_ranks(rank, n), with ids and hosts

  // The assignment of every participant, indexed by arrival (0-based).
  static std::vector<RankAssignment> make(const std::vector<NodeDescriptor>& arrivals,
                                          const std::vector<size_t>& by_rank);
  Bytes encode() const;
  static RankAssignment decode(const Bytes& value);  // throws ProtocolError
};

}  // namespace dlaunch
