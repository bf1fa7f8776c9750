// Tells the training thread, within milliseconds, that the agent is replacing a rank of its
// group: a thread of its own waits in the store for the next generation's verdict
// (K/<generation + 1>, rank_recovery.h) and, when it says `replace` or `shrink` (a node lost:
// the group re-forms too), raises a flag that the training step checks between layers and at
// every gradient (DataParallel's interrupt check).
//
// Why: a survivor otherwise learns of a peer's death only at its step's next collective, the
// gradient all-reduce's end after the whole backward, and without SyncBN that is up to a whole
// step after the death (the agent announces the replacement within a few milliseconds of it).
// The verdict `restart` does not raise the flag: the agent then stops the whole group (a stop
// signal's checkpoint must still be reached at the step's end), and the collectives fail as
// before.
//
// Threading: the watch thread runs from construction to destruction on a store client of its
// own; superseded() may be called from any thread. A store that cannot be reached ends the
// watch quietly (debug line): the step then fails at its next collective, as without it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "rendezvous/store/store.h"

namespace dlaunch::train {

class ReplacementWatch {
 public:
  // Watches `key`'s generations after `generation` through a client made by `connect` (in the
  // watch thread: the caller does not wait for it; the destructor does, so `connect` should
  // give up within seconds).
  ReplacementWatch(std::string key, int64_t generation,
                   std::function<std::shared_ptr<Store>()> connect);
  ~ReplacementWatch();
  ReplacementWatch(const ReplacementWatch&) = delete;
  ReplacementWatch& operator=(const ReplacementWatch&) = delete;

  // The newest generation announced with the verdict replace or shrink (0: none yet).
  int64_t replaced_generation() const { return replaced_.load(std::memory_order_acquire); }

 private:
  void run(int64_t next);

  std::string key_;
  std::function<std::shared_ptr<Store>()> connect_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> replaced_{0};
  std::shared_ptr<Store> client_;  // set by the thread before its first wait; under the atomic
  std::atomic<bool> client_ready_{false};
  std::atomic<bool> stopped_{false};  // the thread is done with the client
  std::thread thread_;
};

}  // namespace dlaunch::train
