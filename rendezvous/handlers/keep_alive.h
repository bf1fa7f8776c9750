// The dynamic rendezvous' keep-alive (dynamic_rendezvous.h): proves this node alive, watches
// its ring neighbours in the running round, tells the others when this node leaves, and judges
// whether the job's store is gone.
//
// A thread (start(), at the first round) steps every keep_alive_interval / 4: it beats every
// interval (Liveness::beat) and looks at the neighbours; a neighbour silent for interval x
// max_attempt is reported as lost: the round's verdict "lost" (FailureVerdicts::write), then a
// kMembershipChanged event for the round. The thread has its own store connection (open_store),
// straight to the store (never through the node's store proxy, which carries workers only),
// and makes it this node's last will (Liveness::use_connection_wills): when the agent is
// killed, the store host sees that connection end at once, and a neighbour that neither
// connected again nor beat within close_grace() is lost then, not after the window.
// stop() ends it within milliseconds (a call blocked on a dead store is interrupted) and marks
// this node as having left cleanly. begin_leaving() has the thread say so earlier, as soon as
// the agent got its stop signal.
//
// Store loss (c10d): the keep-alive is the judge. When the store has not answered it for the
// window, the agent hosting it is gone, and with it every key of the job: it declares the loss
// (StoreLoss::declare: every call fails at once with one sentence naming the store host, and
// watch()'s callback gets kStoreLost). A store whose connection closed and whose port then
// refuses every connect for the reconnect bound (StoreRefusedError: nothing listens there) is
// gone for certain: it is declared lost then, without waiting out the window, which is for
// silence (a partition, an overloaded host). A store outside every agent (etcd) is never
// declared lost: an outage there is waited out.
//
// Keys, under the rendezvous prefix: hb/<node>, left/<node> (the store liveness, liveness.h);
// round/<r>/event (rendezvous_events.h); round/<r>/verdict (failure_verdicts.h).
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "rendezvous/handlers/failure_verdicts.h"
#include "rendezvous/handlers/liveness.h"
#include "rendezvous/handlers/round_table.h"
#include "rendezvous/handlers/store_loss.h"
#include "rendezvous/store/store.h"

namespace dlaunch {

class KeepAlive {
 public:
  struct Settings {
    std::string run_id;    // for messages
    std::string prefix;    // the rendezvous' keys ("dlaunch/rdzv/<run_id>")
    std::string node_id;   // this node's
    std::string host;      // this node's address, as the others name it
    std::string endpoint;  // the store's (--rdzv_endpoint), for messages
    // keep_alive_interval and keep_alive_max_attempt (--rdzv_conf)
    Duration interval = std::chrono::seconds(5);
    int64_t max_attempt = 3;
    // c10d: the store is hosted by one agent and dies with it. A backend that brings its own
    // ledger (etcd) keeps its store outside any agent: an outage there is waited out.
    bool store_dies_with_host = true;
  };
  // The backend's liveness (RendezvousParams::liveness) over a store of the keep-alive's.
  using MakeLiveness = std::function<std::unique_ptr<Liveness>(std::shared_ptr<Store>)>;

  // `open_store`: a fresh connection for the keep-alive (detail::store_opener). `verdicts`
  // and `loss` outlive this object.
  KeepAlive(Settings settings, std::function<std::shared_ptr<Store>()> open_store,
            MakeLiveness make_liveness, FailureVerdicts& verdicts, StoreLoss& loss,
            const Clock& clock);
  ~KeepAlive();  // stop()
  KeepAlive(const KeepAlive&) = delete;
  KeepAlive& operator=(const KeepAlive&) = delete;

  // Starts the thread, unless it runs already, stop() began, or it is driven externally.
  void start();
  // For a driver of many handlers in one process: no thread; the caller calls step() about
  // every interval / 4 instead (from one thread at a time). Call before start().
  void drive_externally();
  // One step: beat when due, announce a leave, report dead neighbours. False once stop() or a
  // store loss ended the keep-alive. Never throws.
  bool step();
  // The round that runs now: its node count, this node's rank and the neighbours it watches.
  void watch_round(int64_t round, int64_t nodes, int64_t rank, std::vector<NodeRef> watched);
  // This node leaves while its round runs: the verdicts count it in no failure from now on,
  // and the next step tells the others (once per round). Never blocks.
  void begin_leaving();
  // Ends the keep-alive and marks this node as left when the store answers. Idempotent.
  void stop();

 private:
  Duration window() const { return settings_.interval * settings_.max_attempt; }
  Duration close_grace() const;
  void loop();
  // Parts of step(), on the keep-alive thread (or its external driver):
  bool open_store();  // false when stop() began meanwhile
  void beat_when_due();
  // Reports the watched neighbours that are dead: the round's verdict, then the event.
  void report_lost_neighbours(const std::vector<NodeRef>& watched, int64_t round);
  void store_answered();  // says so once after trouble
  // How a keep-alive call failed: the store did not answer (or another error), its connection
  // was closed (look again at once), or nothing listens at its address any more.
  enum class StoreFailure { kOther, kClosed, kRefused };
  // After a failed step: drops the connection, says so (once for store trouble, every time for
  // an unexpected exception), declares the store lost after the window (c10d); false once
  // stopping.
  bool failed(const std::string& what, bool unexpected,
              StoreFailure failure = StoreFailure::kOther);
  void finish();  // marks this node as left when the store answers
  std::vector<NodeRef> watched_nodes(int64_t reported_round);  // mutex_ held
  // At begin_leaving() or stop(), while a round of several nodes runs: the others re-form
  // without this node, for free. Once per round.
  void announce_leaving(Store& store);
  void declare_store_lost(Duration silent, bool refused);

  Settings settings_;
  std::function<std::shared_ptr<Store>()> open_store_;
  MakeLiveness make_liveness_;
  FailureVerdicts& verdicts_;
  StoreLoss& loss_;
  const Clock& clock_;

  // Shared between the keep-alive thread and the handler's callers.
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  int64_t round_ = -1;            // the running round
  int64_t nodes_ = 0;             // nodes in it
  int64_t rank_ = -1;             // this node's rank in it
  std::vector<NodeRef> watched_;  // this node's ring neighbours in it
  std::thread thread_;
  std::shared_ptr<Store> store_;  // the thread's store, for stop()'s interrupt
  bool healthy_ = true;           // its last store call succeeded
  bool exited_ = false;
  bool leaving_ = false;          // begin_leaving()
  bool leave_requested_ = false;  // wakes the thread for it
  int64_t leave_announced_round_ = -1;
  bool external_ = false;  // drive_externally()

  // The step's own state (only the thread, or the external driver, touches it).
  struct StepState {
    bool started = false;
    std::shared_ptr<Store> store;
    std::unique_ptr<Liveness> liveness;
    TimePoint last_beat{};
    bool beaten = false;
    bool beat_now = false;  // a new connection: beat at once, whatever the interval says
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
  } state_;
};

}  // namespace dlaunch
