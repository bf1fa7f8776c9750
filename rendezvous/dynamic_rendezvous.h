// The c10d-style elastic rendezvous (--rdzv_backend c10d, --nnodes MIN:MAX): the executor that
// does the I/O for the pure state machine in dynamic_rendezvous_state.h. Written only against
// the Store interface (compare_set on one state record, add for arrivals, wait for wake-ups)
// and the Liveness interface, so it runs over the TCP store and over etcd alike. A backend may
// add a RoundLedger (dynamic_rendezvous_ledger.h) for arrivals and waiting; etcd does.
//
// Keys, under "dlaunch/rdzv/<run_id>":
//   state                      the record (compare_set only)
//   round/<r>/arrivals         arrival counter; round/<r>/node/<i> descriptor of arrival i
//   round/<r>/done, /superseded  wake-up keys set when round r completes / r+1 opens
//   round/<r>/event            the round's event (restart, membership, shutdown)
//   restart_count              job-wide count of failure restarts
//   hb/<node>, left/<node>     keep-alive (store liveness)
//
// Threads: next_rendezvous() runs on the caller's thread. A keep-alive thread (started by the
// first next_rendezvous) beats every keep_alive_interval and watches the node's ring
// neighbours; a node silent for interval x max_attempt triggers kMembershipChanged for the
// round. An EventWatcher thread delivers events to watch()'s callback. Both have their own
// store connections. shutdown() stops them within about one interval and marks this node as
// having left cleanly.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "rendezvous/dynamic_rendezvous_ledger.h"
#include "rendezvous/dynamic_rendezvous_state.h"
#include "rendezvous/rendezvous_events.h"
#include "rendezvous/rendezvous_registry.h"

namespace dlaunch {

class DynamicRendezvous final : public RendezvousHandler {
 public:
  // Connects to the store (or uses params.store). Throws UsageError for a bad node range.
  explicit DynamicRendezvous(const RendezvousParams& params);
  // The same with a RoundLedger (dynamic_rendezvous_ledger.h) for arrivals and waiting instead
  // of the store's counter and polling (the etcd backend). nullptr: as above.
  DynamicRendezvous(const RendezvousParams& params, std::shared_ptr<RoundLedger> ledger);
  // The store prefix of run `run_id`'s rendezvous keys ("dlaunch/rdzv/<run_id>").
  static std::string key_prefix(const std::string& run_id) { return "dlaunch/rdzv/" + run_id; }
  ~DynamicRendezvous() override;

  std::string backend() const override { return params_.backend; }
  std::string run_id() const override { return params_.run_id; }
  RendezvousResult next_rendezvous() override;
  void watch(std::function<void(const RendezvousEvent&)> on_event) override;
  void request_restart(const std::string& report) override;
  int64_t num_nodes_waiting() override;
  void set_closed() override;
  bool is_closed() override;
  void shutdown() override;

  const std::string& node_id() const { return node_id_; }

 private:
  std::string key(const std::string& suffix) const { return prefix_ + "/" + suffix; }
  std::string round_key(int64_t round, const std::string& suffix) const;
  std::optional<DynamicState> read_state();
  RendezvousResult finish_round(const DynamicState& state, TimePoint deadline);
  void begin_worker_namespace(int64_t round);
  void keep_alive_loop();
  void start_keep_alive();

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
  std::shared_ptr<RoundLedger> ledger_;  // nullptr: store arrivals and polling

  // Shared with the keep-alive thread.
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  int64_t running_round_ = -1;
  std::vector<NodeDescriptor> running_nodes_;  // by group rank
  int64_t my_rank_ = -1;
  std::thread keep_alive_;
};

}  // namespace dlaunch
