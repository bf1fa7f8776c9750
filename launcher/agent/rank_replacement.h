// Rank-level recovery, the agent's side of the store: the worker group's generation counter that
// survivors and replacements read (the contract: common/worker_env.h kRecoveryKey, and
// docs/env.md "Rank-level recovery"). step() (agent_step.h) decides when a rank is replaced
// alone or the group restarts; this file only says it in the store and reads what the workers
// announced.
//
//   generation g > 0:  g = add(K, 1), then set(K/g, verdict)
//     "replace": a rank is being started again; the survivors re-form at generation g
//     "restart": the agent restarts (or ends) the whole group; the survivors exit at once
//     "shrink <W'> <round>": a node was lost and the group re-forms in process at world size W'
//       (agent_step.h, keeping_workers); each survivor reads its new rank R' from
//       K/shrink_<round>/rank_<R>, which every agent sets for its own workers
//
// The agent's connection is made like a worker's (no agent declaration), after the round, so
// the store puts its keys in the round's worker namespace, where the workers read theirs
// (rendezvous/tcp/worker_namespace.h); through a store proxy the workers see the same store.
//
// Blocking: announce() blocks the agent's loop for two store round trips, at most
// kRecoveryStoreTimeout each (and as long to connect the first time): the replacement must not
// start before its generation is announced. Throws what the store throws.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "launcher/process/worker_group.h"

namespace dlaunch {

class Store;

inline constexpr Duration kRecoveryStoreTimeout = std::chrono::seconds(5);
inline constexpr char kReplaceVerdict[] = "replace";
inline constexpr char kRestartVerdict[] = "restart";
inline constexpr char kShrinkVerdict[] = "shrink";

// "dlaunch/recovery/<run_id>/attempt_<restart_count>": one counter per worker group.
std::string recovery_key(const std::string& run_id, int64_t restart_count);

// A replacement is in flight from its spawn until it touches its heartbeat file (re-armed
// before it starts), and a worker whose replacement was decided counts until it is started:
// while one is, the group may not be able to re-form, so a second failure restarts it whole.
bool replacement_in_flight(
    const WorkerGroup& group,
    const std::function<std::optional<TimePoint>(const std::string&)>& last_beat);

// Whether any worker of the group (a replacement too) announced rank_recovery.
bool any_announced(const WorkerGroup& group);
// Whether every worker of the group runs and announced rank_recovery: the group can re-form in
// process without any of them.
bool all_announced(const WorkerGroup& group);

class RankRecovery {
 public:
  RankRecovery() = default;
  ~RankRecovery();
  RankRecovery(const RankRecovery&) = delete;
  RankRecovery& operator=(const RankRecovery&) = delete;

  // A new worker group: its key, and where the agent reaches the workers' store (its own view
  // of MASTER_ADDR:MASTER_PORT, not a proxy's). The connection is made at the first announce.
  void begin(std::string key, std::string host, int64_t port, std::optional<std::string> token);
  // None until the next begin(): the workers of this job have no recovery key.
  void off();
  bool on() const { return !key_.empty(); }
  const std::string& key() const { return key_; }

  // Announces the next generation with `verdict`; returns it. Throws what the store throws.
  int64_t announce(const std::string& verdict);
  // The verdict `restart` was announced for this group (it is said once).
  bool restart_announced() const { return restart_announced_; }

  // The latest generation announced. Makes the connection now if there is none, so that it
  // stays in the namespace of the workers' round when the next round begins another (a
  // connection keeps the namespace of its first key operation). Throws what the store throws.
  int64_t current_generation();
  // Announces the shrink to world size `world` agreed in round `round` (kShrinkVerdict); returns
  // the generation. The round's release emptied the workers' namespace, the counter with it:
  // it goes on from `before`, the generation the workers last saw (current_generation() before
  // the round). Throws what the store throws.
  int64_t announce_shrink(int64_t before, int64_t world, int64_t round);
  // Sets K/shrink_<round>/rank_<R> = R' for each (R, R') of this node's workers.
  void tell_new_ranks(int64_t round, const std::vector<std::pair<int64_t, int64_t>>& ranks);

  // Tests: a store of their own instead of a connection.
  void use_store_for_tests(std::shared_ptr<Store> store) { store_ = std::move(store); }

 private:
  std::string key_;
  std::string host_;
  int64_t port_ = 0;
  std::optional<std::string> token_;
  std::shared_ptr<Store> store_;
  bool restart_announced_ = false;

  Store& store();
};

}  // namespace dlaunch
