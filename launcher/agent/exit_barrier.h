// torchrun's exit barrier over the job's store: a node whose workers succeeded waits until every
// node's did, so the agent hosting the store does not take it away while others still use it,
// and so a failure elsewhere still brings this node back for the job-wide restart. Blocking
// calls for a helper thread (the agent runs the wait off its loop, agent.cc).
#pragma once

#include <chrono>
#include <cstdint>

#include "common/clock.h"
#include "rendezvous/store/store.h"

namespace dlaunch {

inline constexpr Duration kExitBarrierTimeout = std::chrono::seconds(300);
inline constexpr Duration kLeaveTimeout = std::chrono::seconds(10);

// Counts this node in for `round` and waits until all `nodes` are in, up to `timeout`. Throws
// what the store throws (a timeout, a lost connection).
void wait_exit_barrier(Store& store, int64_t round, int64_t nodes,
                       Duration timeout = kExitBarrierTimeout);

// After the barrier, once this node has stopped its rendezvous watcher and keep-alive: says so,
// and on the node hosting the store (`hosts_store`) waits up to `timeout` until every node has,
// so the store does not close under watchers that are still connected. Without this the host
// left first and, at 1,024 agents, hundreds of agents logged "closed the connection" warnings
// and some spent up to the keep-alive window (15 s) reconnecting before they could exit
// (docs/benchmarks.md, "Agents at scale"). One store round trip elsewhere; failures only log.
void leave_exit_barrier(Store& store, int64_t round, int64_t nodes, bool hosts_store,
                        Duration timeout = kLeaveTimeout);

}  // namespace dlaunch
