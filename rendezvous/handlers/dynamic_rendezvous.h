// The c10d-style elastic rendezvous (--rdzv_backend c10d, --nnodes MIN:MAX): the executor that
// does the I/O for the pure state machine in dynamic_rendezvous_state.h. Written only against
// the Store interface (compare_set on one state record), a RoundLedger for arrivals and waiting
// (dynamic_rendezvous_ledger.h: over the store by default, etcd brings its own) and the
// Liveness interface, so it runs over the TCP store and over etcd alike, on one code path.
//
// Keys, under "dlaunch/rdzv/<run_id>":
//   state                      the record (compare_set only)
//   round/<r>/arrivals         arrival counter; round/<r>/node/<i> descriptor of arrival i
//   tables/<r>/table, /assign/<i>  written by the node that closes round r: the round's table
//                              and arrival i's rank (round_table.h), so others read O(1)
//   round/<r>/done, /superseded  wake-up keys set when round r completes / r+1 opens
//   round/<r>/event            the round's event (restart, membership, shutdown)
//   round/<r>/acks, /verdict   nodes that saw the round's failure; "C|<writer>" (charged) or
//                              "L|<who> lost ...|<writer>" (settle_failure); <writer> is the
//                              writer's node id, so compare_set tells the first writer apart
//   restart_count              job-wide count of failure restarts
//   hb/<node>, left/<node>     keep-alive (store liveness)
//
// Threads: next_rendezvous() runs on the caller's thread. A keep-alive thread (started by the
// first next_rendezvous) beats every keep_alive_interval and watches the node's ring
// neighbours; a node silent for interval x max_attempt triggers kMembershipChanged for the
// round. An EventWatcher thread delivers events to watch()'s callback. Both have their own
// store connections. shutdown() stops them within milliseconds (a thread blocked on a dead
// store is interrupted) and marks this node as having left cleanly. begin_leaving() has the
// keep-alive thread say so earlier, as soon as the agent got its stop signal.
//
// Store loss (c10d): the keep-alive thread is the judge. When the store has not answered it
// for keep_alive_interval x keep_alive_max_attempt, the agent hosting it is gone, and with it
// every key of the job: next_rendezvous() and every other call then throw ConnectionError with
// one sentence naming the store host, and watch()'s callback gets kStoreLost. A store whose
// connection closed and whose port then refuses every connect for the reconnect bound
// (StoreRefusedError: nothing listens there) is gone for certain: it is declared lost then,
// without waiting out the window, which is for silence (a partition, an overloaded host).
// Until then a next_rendezvous() whose store call fails retries (a reconnect is bounded by a
// few seconds).
//
// Failures and node loss: a worker failure is published (request_restart) at once, but whether
// it spends the budget is settled per round (settle_failure): every node that sees the failure
// adds itself to round/<r>/acks; when all participants did, the verdict "charged" is written
// (round/<r>/verdict, first writer wins) and restart_count incremented once. A participant that
// died never acks; its keep-alive observer writes the verdict "lost" instead, so the restart is
// free and the cause is the lost node, not its peers' connection errors.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "rendezvous/handlers/dynamic_rendezvous_ledger.h"
#include "rendezvous/handlers/dynamic_rendezvous_state.h"
#include "rendezvous/handlers/rendezvous_events.h"
#include "rendezvous/handlers/rendezvous_registry.h"
#include "rendezvous/handlers/round_table.h"
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
  // The closer's records (round_table.h), outside round/<r>/: etcd's ledger watches that
  // prefix, and N assignments there would be N watch events for every node.
  std::string table_key(int64_t round, const std::string& suffix) const {
    return prefix_ + "/tables/" + std::to_string(round) + "/" + suffix;
  }
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
  // This node's place in a released round: the closer's table and assignment (`done` says the
  // closer wrote them), else computed from every descriptor (an older closer).
  struct Place {
    RoundTable table;
    RankAssignment me;         // rank -1: the round formed without this node
    int64_t restart_count = -1;  // -1: not read yet
  };
  // `released`: the values of place_keys() as wait_for_release read them ("done" at least).
  Place read_my_place(const DynamicState& state, const std::vector<std::optional<Bytes>>& released,
                      TimePoint deadline);
  // "done", the table, this node's assignment and restart_count of `round`: what a released
  // round's node reads (the last three from a closer that wrote the table).
  std::vector<std::string> place_keys(int64_t round) const;
  Place decode_place(const Bytes& table, const Bytes& me, const Bytes& restart_count) const;
  // The rest of finish_round once the place is known: nullopt when the round formed without
  // this node; else the result, and the running round recorded for the keep-alive.
  std::optional<RendezvousResult> enter_round(const DynamicState& state, Place place);
  // Blocks until the round is released ("done"); returns the values of place_keys() (at least
  // "done"'s: the ledger may read the others with it, wait_key_fetching). Takes over the release
  // when the closer did not within the keep-alive window.
  std::vector<std::optional<Bytes>> wait_for_release(const DynamicState& state, TimePoint deadline);
  // Descriptors of arrivals 1..n of `round` (O(N): the closing node only); waits for missing
  // ones until `wait_until`, then leaves them out, saying so.
  RoundLedger::Described read_participants(int64_t round, int64_t n, TimePoint wait_until);
  Duration keep_alive_window() const {
    return config_.keep_alive_interval * config_.keep_alive_max_attempt;
  }
  // The closing node's share: the round's table and every node's assignment (round_table.h).
  // False (nothing written) when fewer than MIN participants described themselves.
  bool publish_round_table(int64_t round, int64_t n, TimePoint deadline);
  // The closer's (or the takeover's) share after COMPLETE(r, n): the table, the workers'
  // namespace, then "done"; or, with fewer than MIN live participants, OPEN(r+1) and "done"
  // saying so.
  void release_round(const DynamicState& complete, TimePoint deadline);
  void begin_worker_namespace(int64_t round);
  // At begin_leaving() or shutdown, while a round of several nodes runs: the others re-form
  // without this node, for free (keep-alive thread). Once per round.
  void announce_leaving(Store& store);
  void keep_alive_loop();
  // Parts of keep_alive_step(), on the keep-alive thread (or its external driver):
  bool open_keep_alive_store();  // false when shutdown() began meanwhile
  void beat_when_due();
  // Reports the watched neighbours that are dead: the round's verdict, then the event.
  void report_lost_neighbours(const std::vector<NodeRef>& watched, int64_t round);
  void store_answered();  // says so once after trouble
  // After a failed step: drops the connection, says so (once for store trouble, every time for
  // an unexpected exception), declares the store lost after the window (c10d); false once
  // stopping.
  // How a keep-alive call failed: the store did not answer (or another error), its connection
  // was closed (look again at once), or nothing listens at its address any more.
  enum class StoreFailure { kOther, kClosed, kRefused };
  bool keep_alive_failed(const std::string& what, bool unexpected,
                         StoreFailure failure = StoreFailure::kOther);
  void keep_alive_finish();  // marks this node as left when the store answers
  std::vector<NodeRef> watched_nodes(int64_t reported_round);  // mutex_ held
  void start_keep_alive();
  // Store loss (c10d: the store lives in one agent). The keep-alive thread declares it after
  // the store did not answer for the keep-alive window; from then on every call fails at once
  // with the sentence, a call blocked on the store is interrupted, and the watcher's callback
  // gets kStoreLost.
  void declare_store_lost(Duration silent, bool refused);
  std::string store_lost();
  [[noreturn]] void throw_store_lost(const std::string& why);
  // This node saw the round's failure (once per round): counts it in round/<r>/acks, and the
  // node that completes the count (every node alive) fixes the verdict "charged".
  void ack_failure();
  // Writes the round's verdict if none is there yet; true when this call wrote it.
  bool write_verdict(Store& store, int64_t round, const std::string& verdict);

  RendezvousParams params_;
  RendezvousConfig config_;
  DynamicLimits limits_;
  const Clock& clock_;
  std::shared_ptr<Store> store_;
  std::function<std::shared_ptr<Store>()> open_store_;
  std::string prefix_;
  std::string node_id_;
  DynamicNodeView view_;
  std::unique_ptr<EventWatcher> watcher_;
  std::shared_ptr<RoundLedger> ledger_;  // the backend's, else a StoreRoundLedger

  // Shared with the keep-alive thread.
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  int64_t running_round_ = -1;
  int64_t running_n_ = 0;          // nodes in the running round
  std::vector<NodeRef> watched_;   // this node's ring neighbours in it (keep-alive)
  int64_t my_rank_ = -1;
  std::thread keep_alive_;
  std::shared_ptr<Store> keep_alive_store_;  // the thread's store, for shutdown()'s interrupt
  bool keep_alive_healthy_ = true;           // its last store call succeeded
  bool keep_alive_exited_ = false;
  // begin_leaving(): this node acks no failure, and the keep-alive announces the leave.
  bool leaving_ = false;
  bool leave_requested_ = false;  // wakes the keep-alive thread for it
  int64_t leave_announced_round_ = -1;
  bool external_keep_alive_ = false;  // drive_keep_alive_externally()
  // The keep-alive's own state (only its thread, or the external driver, touches it).
  struct KeepAliveState {
    bool started = false;
    std::shared_ptr<Store> store;
    std::unique_ptr<Liveness> liveness;
    TimePoint last_beat{};
    bool beaten = false;
    int64_t reported_round = -1;
    int64_t looked_round = -1;  // the round whose nodes the liveness's windows are about
    // When the store last answered, and whether it does not now: one warning when it stops,
    // one line when it is back, not one per retry.
    TimePoint last_contact{};
    bool in_trouble = false;
    // The last call saw the connection closed: the next step comes at once, not a tick later,
    // so a store host that died is found refusing within the reconnect bound.
    bool look_again_now = false;
    // What the step was doing, for its warning: a store error names the key it was on, and a
    // watched neighbour's key would read as if this node were that one.
    std::string doing;
  } keep_alive_state_;
  // c10d: the store is hosted by one agent and dies with it. A backend that brings its own
  // ledger (etcd) keeps its store outside any agent: an outage there is waited out.
  bool store_dies_with_host_ = true;
  std::string store_lost_;  // non-empty once the store was declared lost
  std::function<void(const RendezvousEvent&)> on_event_;  // watch()'s callback
  int64_t acked_round_ = -1;
  std::mutex verdict_mutex_;  // write_verdict's tries, one at a time
  int64_t verdict_round_ = -1;  // the last round whose verdict this node wrote
  bool version_mix_warned_ = false;  // once per agent, not every round (next_rendezvous' thread)
};

}  // namespace dlaunch
