// Rank-level recovery, the worker's half: when a peer rank dies, this worker stays up, waits for
// the agent to respawn that rank, and re-forms the group with the replacement
// (docs/env.md, "Rank-level recovery"; the agent's half is launcher/'s).
//
//   a collective fails (ConnectionError, TimeoutError)
//     -> drop the group (abandon it: the other survivors' waits end too)
//     -> wait for the store key K/<generation + 1> (K = DLAUNCH_RECOVERY_KEY), heartbeating
//     -> read the latest generation g = add(K, 0) and the verdicts up to it, K/<g>, in order
//          restart: rethrow the original error (the agent restarts the whole group)
//          replace: nothing more (a rank is respawned)
//          shrink W' <round>: a node was lost; wait for K/shrink_<round>/rank_<this rank>, the
//                   rank R' this worker takes in the smaller world of W' ranks
//     -> join generation g ("dtrain/attempt_<n>/gen_<g>") as this (maybe new) rank, then
//        `exchange` on it
//     -> a join or an exchange that fails (another death) waits for the next generation again;
//        a join watches for that generation too (join_generation), so a rank that died during
//        it does not keep the others waiting until the join timeout
//
// A replacement (DLAUNCH_REPLACEMENT=1) joins the generation the counter holds when it starts
// (current_generation) and takes the state in resume(); from then on it is a survivor like the
// others. What a failed step leaves behind and how the state is exchanged is the trainer's part
// (trainer.cc, resume.h's exchange_state_as_survivor).
//
// Blocking: reform() waits up to the join timeout for the agent's verdict (every wait), then
// joins. Errors: the original error rethrown (verdict restart, or no verdict in time); what the
// join or the exchange throws that is not a peer's failure. The training thread's.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "common/worker_env.h"
#include "rendezvous/store/store.h"
#include "worker/comm/reformable_process_group.h"
#include "worker/train/replacement_watch.h"
#include "worker/train/train_config.h"

namespace dlaunch::train {

// Why this worker does not recover peers' deaths in process ("" when it does): no
// DLAUNCH_RECOVERY_KEY (the agent restarts whole groups), --rank_recovery off, a world of one,
// or an NCCL group (a broken NCCL communicator cannot be dropped without ncclCommAbort, which
// dtrain's NCCL group does not call yet).
std::string rank_recovery_off_reason(const TrainConfig& config, const WorkerEnv& env,
                                     const std::string& group_backend);

// DLAUNCH_RECOVERY_KEY's value ("" when unset).
std::string recovery_key_from_env();

// The generation a replacement joins: the counter at `key` (0 while the agent never bumped it).
int64_t current_generation(Store& store, const std::string& key);

// Whether `e` is a peer's failure seen by a collective (what reform() handles).
bool is_peer_failure(const std::exception& e);

// Joins generation `g` of the group as rank `rank` of `world`, bootstrapping through `client`
// (bootstrap.h's join_process_group).
using JoinGroup = std::function<std::unique_ptr<comm::ProcessGroup>(
    int64_t g, int rank, int world, std::shared_ptr<Store> client)>;
// A new client of the agent's store.
using ConnectStore = std::function<std::shared_ptr<Store>()>;

// `join` of generation `g` through a new client while `counter` is watched for generation g + 1
// at `key`: when the agent announces it first (a rank died during this re-form; its replacement
// will join g + 1), the join's blocking store calls are interrupted and this throws
// ConnectionError at once, instead of the join waiting for a rank that is gone until its timeout.
std::unique_ptr<comm::ProcessGroup> join_generation(Store& counter, const std::string& key,
                                                    int64_t g, int rank, int world,
                                                    const ConnectStore& connect,
                                                    const JoinGroup& join);

// A replacement's first join: the latest generation, then the next one each time the one it
// joins is superseded (join_generation). Returns the group and sets `*generation`.
std::unique_ptr<comm::ProcessGroup> join_latest_generation(Store& counter, const std::string& key,
                                                           int rank, int world,
                                                           const ConnectStore& connect,
                                                           const JoinGroup& join,
                                                           int64_t* generation);

class RankRecovery {
 public:
  // Runs the state exchange on the re-formed group: false when the group broke during it.
  using Exchange = std::function<bool()>;

  // `verdict_timeout`: how long a survivor waits for the agent's word after a peer died
  // (ConnectionError). `stuck_peer_wait`: the shorter wait after a collective timed out
  // (TimeoutError): the peer may be alive and stuck, which the agent acts on only with
  // --hang_timeout; without it no word comes, and the worker had better exit (withdrawing its
  // announcement, so that the agent restarts the whole group and kills the stuck rank) than
  // hold the job for the join timeout. `watch_connect`: a store client for the
  // ReplacementWatch (replacement_watch.h), which should give up connecting within seconds;
  // empty: no watch, a peer's death is seen at the step's next collective only.
  RankRecovery(std::string key, std::shared_ptr<Store> store, comm::ReformableProcessGroup& pg,
               ConnectStore connect, JoinGroup join, std::chrono::milliseconds verdict_timeout,
               std::chrono::milliseconds stuck_peer_wait, int64_t generation,
               ConnectStore watch_connect = {});

  // The generation this worker's group belongs to now.
  int64_t generation() const { return generation_; }
  // Drops the broken group (ReformableProcessGroup::drop).
  void drop_group() { pg_.drop(); }
  // Throws ConnectionError when the agent announced that it replaces a rank of this group (the
  // watch saw a newer generation with the verdict replace): the step in progress cannot
  // complete, and the caller abandons it as if its collective had failed. The training step
  // calls it between layers (DataParallel::set_interrupt_check). Cheap: one atomic load.
  void abandon_step_if_replacing() const;
  // After drop_group(): waits, joins and exchanges as above; returns when `exchange` succeeded
  // on a re-formed group. Rethrows `error` when the agent restarts the group instead. After a
  // shrink the group (`pg`) has this worker's new rank and world size: the caller compares.
  void reform(const std::exception_ptr& error, const Exchange& exchange);

 private:
  // Waits for the verdict of the generation after generation_ and reads every verdict up to the
  // latest generation, which it returns; a shrink among them moves `pg` to this worker's new
  // rank (take_new_seat). Rethrows `error` when no verdict came in time or one says restart.
  int64_t wait_for_verdict(const std::exception_ptr& error);
  // Generation `g`'s verdict ("" when it was not set within the verdict timeout).
  std::string read_verdict(int64_t g);
  // A shrink to `world` ranks in rendezvous round `round`: waits for this worker's new rank and
  // moves `pg` to it. Rethrows `error` when none comes in time or it is not a rank of `world`.
  void take_new_seat(int64_t g, int64_t world, const std::string& round,
                     const std::exception_ptr& error);
  // Waits up to `wait` for `key`, heartbeating every slice; false when it did not appear.
  bool wait_with_heartbeats(const std::string& key, std::chrono::milliseconds wait);

  std::string key_;
  std::shared_ptr<Store> store_;
  comm::ReformableProcessGroup& pg_;
  ConnectStore connect_;
  JoinGroup join_;
  std::chrono::milliseconds verdict_timeout_;
  std::chrono::milliseconds stuck_peer_wait_;
  int64_t generation_;
  std::unique_ptr<ReplacementWatch> watch_;  // null: none
};

}  // namespace dlaunch::train
