// Whether the round after a lost node shrinks the worker group in place: the nodes that kept
// their workers through the rendezvous (agent_step.h, keeping_workers) agree on it in the job's
// store, so that every node of the round does the same (a node that started fresh workers in
// it needs everyone to restart). Shrink when every node of the new round kept its workers and
// none that did is missing from it:
//
//   before joining:   add(shrink/after_round_<old>/kept, 1)       every node that keeps its workers
//   after the round:  n = add(shrink/round_<r>/kept, 1)           the same nodes, now members
//                     the node with n == the round's size decides: shrink when as many kept
//                     their workers before joining, else restart (a survivor is late)
//                     compare_set(shrink/round_<r>/verdict, "", decision); the first one holds
//   the others wait for the verdict; one that waited `timeout` writes `restart` the same way
//
// A node that joined fresh (a new one, or one whose workers were stopped) never counts itself
// in, so its round ends in `restart` after the timeout. A survivor that counts itself in before
// joining but only after the decision is late for that round: it joins the next one, as any
// node that asks in. Blocking, off the loop (the round's helper thread); throws the store's
// errors (the caller falls back to a restart).
#pragma once

#include <cstdint>

#include "common/clock.h"

namespace dlaunch {

class Store;

inline constexpr Duration kShrinkAgreementTimeout = std::chrono::seconds(30);

// Before joining the round that follows `old_round`, with the workers kept.
void mark_kept_workers(Store& job_store, int64_t old_round);

// After round `round` of `nodes` nodes formed, on a node that kept its workers: true when the
// round shrinks the group in place.
bool agree_to_shrink(Store& job_store, int64_t old_round, int64_t round, int64_t nodes,
                     Duration timeout = kShrinkAgreementTimeout);

}  // namespace dlaunch
