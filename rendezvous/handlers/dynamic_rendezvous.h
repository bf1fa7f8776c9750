// The c10d-style elastic rendezvous (--rdzv_backend c10d, --nnodes MIN:MAX): the executor that
// does the I/O for the pure state machine in dynamic_rendezvous_state.h. Written only against
// the Store interface (compare_set on one state record), a RoundLedger for arrivals and waiting
// (dynamic_rendezvous_ledger.h: over the store by default, etcd brings its own) and the
// Liveness interface, so it runs over the TCP store and over etcd alike, on one code path.
//
// Keys, under "dlaunch/rdzv/<run_id>":
//   state                      the record (compare_set only)
//   round/<r>/arrivals         arrival counter; round/<r>/node/<i> descriptor of arrival i
//   round/<r>/closer           picks the node that closes round r among those that saw it
//                              complete; it releases the round (round_release.h): writes
//                              tables/<r>/table, /assign/<i> (round_table.h), so others read O(1)
//   round/<r>/done, /superseded  wake-up keys set when round r completes / r+1 opens
//   round/<r>/event            the round's event (restart, membership, shutdown)
//   round/<r>/acks, /verdict   a failure's acks and verdict (failure_verdicts.h)
//   restart_count              job-wide count of failure restarts
//   hb/<node>, left/<node>     keep-alive (store liveness)
//
// Threads: next_rendezvous() runs on the caller's thread. The keep-alive (keep_alive.h: a
// thread started by the first next_rendezvous) beats every keep_alive_interval and watches the
// node's ring neighbours; a node silent for interval x max_attempt triggers kMembershipChanged
// for the round. An EventWatcher thread delivers events to watch()'s callback. Both have their
// own store connections. shutdown() stops them within milliseconds (a thread blocked on a dead
// store is interrupted) and marks this node as having left cleanly. begin_leaving() has the
// keep-alive say so earlier, as soon as the agent got its stop signal.
//
// Store loss (c10d): the keep-alive is the judge (keep_alive.h). Once it declared the store
// lost (store_loss.h), next_rendezvous() and every other call throw ConnectionError with one
// sentence naming the store host, and watch()'s callback gets kStoreLost. Until then a
// next_rendezvous() whose store call fails retries (a reconnect is bounded by a few seconds).
//
// Failures and node loss: a worker failure is published (request_restart) at once, but whether
// it spends the budget is settled per round (settle_failure) from the nodes' acks and the
// keep-alive's verdicts (failure_verdicts.h).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "rendezvous/handlers/dynamic_rendezvous_ledger.h"
#include "rendezvous/handlers/dynamic_rendezvous_state.h"
#include "rendezvous/handlers/failure_verdicts.h"
#include "rendezvous/handlers/keep_alive.h"
#include "rendezvous/handlers/rendezvous_events.h"
#include "rendezvous/handlers/rendezvous_registry.h"
#include "rendezvous/handlers/round_release.h"
#include "rendezvous/handlers/round_table.h"
#include "rendezvous/handlers/store_loss.h"
#include "rendezvous/tcp/wait_notes.h"

namespace dlaunch {

class DynamicRendezvous final : public RendezvousHandler {
 public:
  // Connects to the store (or uses params.store). Throws UsageError for a bad node range.
  explicit DynamicRendezvous(const RendezvousParams& params);
  // The same with the backend's RoundLedger (dynamic_rendezvous_ledger.h) for arrivals and
  // waiting instead of the store's counter and polling (the etcd backend). nullptr: as above.
  DynamicRendezvous(const RendezvousParams& params, std::shared_ptr<RoundLedger> ledger);
  // The store prefix of run `run_id`'s rendezvous keys ("dlaunch/rdzv/<run_id>").
  static std::string key_prefix(const std::string& run_id) { return "dlaunch/rdzv/" + run_id; }
  ~DynamicRendezvous() override;

  std::string backend() const override { return params_.backend; }
  std::string run_id() const override { return params_.run_id; }
  RendezvousResult next_rendezvous() override;
  void watch(std::function<void(const RendezvousEvent&)> on_event) override;
  void prepare_watch() override { watcher_->prepare(); }
  void request_restart(const std::string& report) override;
  FailureVerdict settle_failure() override;
  void begin_leaving() override;
  int64_t num_nodes_waiting() override;
  void expect_nodes(int64_t nodes) override { expected_nodes_ = nodes; }
  void mark_finished() override;
  void set_closed() override;
  bool is_closed() override;
  void shutdown() override;

  const std::string& node_id() const { return node_id_; }

  // For a driver of many handlers in one process (bench/rendezvous/rdzv_sim.cc), where a thread
  // per handler does not fit: no keep-alive thread is started; the caller calls
  // keep_alive_step() about every keep_alive_interval / 4 instead (from one thread at a time).
  // Call before the first next_rendezvous(). keep_alive_step() returns false once shutdown()
  // or a store loss ended the keep-alive; shutdown() then marks this node as left.
  void drive_keep_alive_externally();
  bool keep_alive_step();

 private:
  std::string key(const std::string& suffix) const { return prefix_ + "/" + suffix; }
  std::string round_key(int64_t round, const std::string& suffix) const;
  std::optional<DynamicState> read_state();
  // A joining node's read: the record, created as round 0 (OPEN) when there is none.
  std::optional<DynamicState> read_or_create_state();

  // One next_rendezvous() call's way through the join state machine (decide_join), a step at
  // a time: read what changed, decide, act, and wait for news when there is nothing to do.
  struct JoinAttempt {
    TimePoint deadline;  // the join timeout
    WaitNotes notes{TimePoint{}};  // when a waiting node says so again
    std::optional<DynamicState> state;
    // `state` and the arrival count are news enough to decide again without reading them:
    // this node just joined (the state OPEN, as it was, and the count its join returned; two
    // requests per node and round), or its wait brought them (wait_in_my_round).
    bool fresh = false;
    bool announced_waiting = false;  // as a late arrival, to the running round
    TimePoint last_gone_check{};
    std::unique_ptr<Liveness> waiting_liveness;  // only while waiting for a full round to end
    // The running round this node waits to follow, and whether it was marked finished when this
    // node first looked (a mark from a job that ended before this node came: etcd keeps it).
    int64_t finish_checked_round = -1;
    bool finished_before = false;
    std::optional<RendezvousResult> result;      // this node's round formed
  };
  // One step; the result once this node's round formed.
  std::optional<RendezvousResult> join_step(JoinAttempt& a);
  // Waiting in the open round this node joined: waits for "done" and reads with the wait's end
  // this node's place (then sets a.result when the round was released with its table) or else
  // the state and the count (RoundLedger::wait_fetching). False when the node is not in that
  // position (the caller waits as before).
  bool wait_in_my_round(JoinAttempt& a);
  // Inside a catch handler of a store error: rethrows it when the store was declared lost or
  // the join timeout passed; else logs it (the caller retries).
  void retry_or_rethrow(TimePoint deadline, const Error& e);
  // The arrival count of the round this node joined, while that round is open.
  void refresh_arrivals(const std::optional<DynamicState>& state, TimePoint now);
  void take_arrivals(const RoundLedger::Count& count);
  // Says that this node still waits, how many nodes joined (and which, for the round's first
  // arrival of a small round) and for how long of the join timeout.
  void note_waiting(const JoinAttempt& a, const JoinDecision& d, TimePoint now);
  // A late arrival waiting for the running round `round` to end: throws JobFinishedError when
  // that round was marked finished while this node waited (mark_finished), after counting
  // this node as told.
  void check_finished_while_waiting(JoinAttempt& a, int64_t round, bool first_look);
  // A late arrival waiting for a full round to end: are all its nodes gone (dead or left)?
  // Once per keep-alive interval; sets view_.running_round_dead.
  void check_running_round_gone(JoinAttempt& a, TimePoint now);
  // Carries out the decision; true when nothing is left to do but wait for news.
  bool act(const JoinDecision& d, JoinAttempt& a, TimePoint now);
  void join_round(int64_t round, TimePoint now);
  [[noreturn]] void throw_join_timeout(const JoinAttempt& a, const JoinDecision& d);
  // The backend's liveness (RendezvousParams::liveness) over `store`.
  std::unique_ptr<Liveness> make_liveness(std::shared_ptr<Store> store) const;

  // nullopt: the round formed without this node (it described itself too late).
  std::optional<RendezvousResult> finish_round(const DynamicState& state, TimePoint deadline);
  // The rest of finish_round once the place is known: nullopt when the round formed without
  // this node; else the result, and the running round recorded for the keep-alive.
  std::optional<RendezvousResult> enter_round(const DynamicState& state,
                                              RoundRelease::Place place);
  Duration keep_alive_window() const {
    return config_.keep_alive_interval * config_.keep_alive_max_attempt;
  }
  // Throws the store loss' ConnectionError once the keep-alive declared it.
  void throw_if_store_lost() const;

  RendezvousParams params_;
  RendezvousConfig config_;
  DynamicLimits limits_;
  const Clock& clock_;
  std::shared_ptr<Store> store_;
  std::function<std::shared_ptr<Store>()> open_store_;
  std::string prefix_;
  std::string node_id_;
  DynamicNodeView view_;
  // expect_nodes(), from the agent's thread; taken by the next next_rendezvous().
  std::atomic<int64_t> expected_nodes_{0};
  std::unique_ptr<EventWatcher> watcher_;
  std::shared_ptr<RoundLedger> ledger_;  // the backend's, else a StoreRoundLedger
  std::unique_ptr<RoundRelease> release_;

  // The running round, as this node entered it (read from the watcher's thread too).
  std::mutex mutex_;
  int64_t running_round_ = -1;
  int64_t my_rank_ = -1;
  // Made in this order, so destroyed keep-alive first: it uses the other two.
  std::unique_ptr<StoreLoss> store_loss_;
  std::unique_ptr<FailureVerdicts> verdicts_;
  std::unique_ptr<KeepAlive> keep_alive_;
  bool version_mix_warned_ = false;  // once per agent, not every round (next_rendezvous' thread)
};

}  // namespace dlaunch
