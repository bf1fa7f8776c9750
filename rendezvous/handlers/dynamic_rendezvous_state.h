// The c10d-style dynamic rendezvous as pure functions of (shared state, local view, now): no
// I/O, no clock reads, so every transition is unit-tested with scripted times.
//
// The shared state is one small record, changed only by compare_set:
//
//   (none) --create--> OPEN(r) --complete(n)--> COMPLETE(r, n) --open next--> OPEN(r+1) ...
//                         |                          |
//                         +-------close--------------+----------> CLOSED
//
// Arrivals are not in the record (c10d keeps a participant list there, which makes every join a
// compare_set of a growing record and 1,000 agents contend on it): a node joins round r with
// one atomic add on "round/r/arrivals", which gives it an arrival index, and writes its
// descriptor under that index. Round r's participants are arrivals 1..n where n is fixed by
// the compare_set to COMPLETE; later arrivals wait for round r+1 (num_nodes_waiting).
//
// A round completes at MAX arrivals at once, or once MIN have arrived and no new node arrived
// for last_call_timeout (measured on each node's own clock from when it saw the count change),
// or, for a node told whom to expect, once that many arrived.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "rendezvous/store/store.h"

namespace dlaunch {

struct DynamicState {
  enum class Status : uint8_t { kOpen, kComplete, kClosed };
  int64_t round = 0;
  Status status = Status::kOpen;
  int64_t participants = 0;  // n, once complete

  Bytes encode() const;
  // nullopt for an empty value (no state yet); throws ProtocolError on garbage.
  static std::optional<DynamicState> decode(const Bytes& value);
  bool operator==(const DynamicState& o) const {
    return round == o.round && status == o.status && participants == o.participants;
  }
};

// What this node knows that is not in the shared record.
struct DynamicNodeView {
  int64_t last_round = -1;     // the last round this node completed (ran workers in)
  int64_t joined_round = -1;   // the round whose arrivals this node counted itself in
  int64_t arrival_index = 0;   // 1-based, in joined_round
  int64_t arrivals = 0;        // the latest arrival count seen for joined_round
  TimePoint arrivals_changed_at{};
  bool running_round_dead = false;  // every participant of the running round died or left
  // > 0: the round completes once this many (and MIN) arrived, without the last call
  // (RendezvousHandler::expect_nodes).
  int64_t expected_arrivals = 0;
};

struct DynamicLimits {
  int64_t min_nodes = 1;
  int64_t max_nodes = 1;
  Duration last_call_timeout = std::chrono::seconds(1);
};

enum class JoinStep {
  kCreate,          // no record yet: compare_set it to OPEN(0)
  kJoin,            // add to the round's arrivals
  kComplete,        // compare_set OPEN(r) -> COMPLETE(r, decision.participants)
  kOpenNext,        // compare_set COMPLETE(r) -> OPEN(r+1) (this node ran r and re-joins)
  kDone,            // this node is one of round r's participants: read descriptors, rank
  kWaitNextRound,   // arrived after r completed: wait for OPEN(r+1)
  kWait,            // wait until decision.wake_at or a change
  kClosed,          // the rendezvous is closed
};
const char* join_step_name(JoinStep s);

struct JoinDecision {
  JoinStep step = JoinStep::kWait;
  DynamicState next;          // the record to compare_set (kCreate/kComplete/kOpenNext)
  int64_t participants = 0;   // kComplete
  TimePoint wake_at{};        // kWait: when the decision may change without news
};

JoinDecision decide_join(const std::optional<DynamicState>& state, const DynamicNodeView& view,
                         const DynamicLimits& limits, TimePoint now);

// A participant as it advertised itself.
struct NodeDescriptor {
  std::string id;
  std::string host;
  int64_t local_world_size = 1;
  int64_t rank_hint = -1;  // -1: none
  // The node's group rank in the last round it ran in (-1: none): kept when possible, so a
  // node joining or leaving does not renumber the others (the first node stays rank 0).
  int64_t previous_rank = -1;
  // The agent's build ("0.1.0+3467aab", version_mix.h); empty: none published (an older agent).
  std::string version;

  Bytes encode() const;
  static NodeDescriptor decode(const Bytes& value);  // throws ProtocolError
};

// Group ranks for participants listed in arrival order: a hint h in [0, n) is honoured for the
// first node that asks for it; then a node's previous rank in [0, n), if still free; everyone
// else fills the free ranks in arrival order. Returns the participant index (into `arrivals`)
// for each rank.
std::vector<size_t> assign_ranks(const std::vector<NodeDescriptor>& arrivals);

// Keep-alive: which ranks a node watches (its ring neighbours), so the cost per node is
// constant however large the job. Every rank is watched by two others when n >= 3.
std::vector<int64_t> watched_ranks(int64_t my_rank, int64_t n);

}  // namespace dlaunch
