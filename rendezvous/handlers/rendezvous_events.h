// Events pushed between the nodes of a running round: "restart" (a worker failed somewhere),
// "membership changed" (a node died or wants in), "shutdown" (rendezvous closed). One record per
// round at "<prefix>/round/<r>/event", written with compare_set from empty so the first event
// of a round wins; the others are moot since every node re-forms anyway.
//
// EventWatcher owns one thread that blocks on the current round's record (store wait() in
// slices) and calls the callback once per round, on that thread (not for a restart this node
// requested itself). stop() returns within milliseconds: open_store gives the thread a store
// of its own (its own connection, as detail::store_opener and the etcd backend do), and stop()
// ends the blocked wait with Store::interrupt() (TCP and etcd stores implement it; others end
// their wait at the slice's end).
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "rendezvous/handlers/rendezvous_handler.h"
#include "rendezvous/store/store.h"

namespace dlaunch {

struct EventRecord {
  RendezvousEvent::Kind kind = RendezvousEvent::Kind::kRestartRequested;
  std::string origin;  // node id of the publisher
  std::string reason;
};

Bytes encode_event(const EventRecord& e);
std::optional<EventRecord> decode_event(const Bytes& value);
std::string event_key(const std::string& prefix, int64_t round);

// Publishes `e` for `round`; true when it was the first event of the round. Blocks one round
// trip; throws the store's errors.
bool publish_event(Store& store, const std::string& prefix, int64_t round, const EventRecord& e);

class EventWatcher {
 public:
  EventWatcher(std::function<std::shared_ptr<Store>()> open_store, std::string prefix,
               std::string self_id, Duration slice);
  ~EventWatcher();
  EventWatcher(const EventWatcher&) = delete;
  EventWatcher& operator=(const EventWatcher&) = delete;

  // Starts the thread and opens its store ahead of the first watch(), so that neither is on
  // the path from a round's end to the workers (called when a rendezvous begins). A failed
  // connect is dropped here and tried again once watch() arms the watcher. Idempotent.
  void prepare();
  // Watches `round` from now on, replacing any earlier round and callback.
  void watch(int64_t round, std::function<void(const RendezvousEvent&)> on_event);
  // Stops watching and joins the thread: within milliseconds for a store that implements
  // Store::interrupt() (TCP, etcd), else within one slice; while open_store is still connecting, within its connect timeout.
  // Idempotent; never throws.
  void stop();

 private:
  void run();
  void run_loop();
  // Opens the thread's store into `store` and makes it the one stop() interrupts; false when
  // stopping. Throws what open_store throws.
  bool open(std::shared_ptr<Store>& store);

  std::function<std::shared_ptr<Store>()> open_store_;
  std::string prefix_, self_;
  Duration slice_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  bool exited_ = false;  // run() returned
  bool armed_ = false;
  // The thread's store: stop() interrupts a call blocked in it
  // (a no-op while the thread is not in a call). The thread is its only user.
  std::shared_ptr<Store> watched_store_;
  int64_t round_ = -1;
  uint64_t generation_ = 0;
  std::function<void(const RendezvousEvent&)> on_event_;
  std::thread thread_;
};

}  // namespace dlaunch
