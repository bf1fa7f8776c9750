// The job's store declared gone, shared by the parts of the dynamic rendezvous: the keep-alive
// declares it (keep_alive.h: it is the judge), and every other call then fails at once with
// the sentence instead of waiting on a store that will not answer again.
//
// Thread-safe; never blocks longer than asked. declare() interrupts a call blocked on the
// store it was given and tells the callback once.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/clock.h"
#include "rendezvous/handlers/rendezvous_handler.h"
#include "rendezvous/store/store.h"

namespace dlaunch {

class StoreLoss {
 public:
  // `interrupted`: the store whose blocked calls (a round, a restart request, a settle) end
  // when the loss is declared.
  explicit StoreLoss(std::shared_ptr<Store> interrupted) : store_(std::move(interrupted)) {}
  StoreLoss(const StoreLoss&) = delete;
  StoreLoss& operator=(const StoreLoss&) = delete;

  // The sentence naming the store and what to do; empty while the store is not lost.
  std::string reason() const;
  // Waits `d`, or less once the loss is declared.
  void wait_for(Duration d) const;
  // The first declaration holds; later ones are dropped.
  void declare(const std::string& reason);
  // The callback told of the declaration (watch()'s: a kStoreLost event), replacing any
  // earlier one. Returns the reason when the loss was declared already: nobody told the new
  // callback then, and the caller does.
  std::string tell(std::function<void(const RendezvousEvent&)> on_event);

 private:
  std::shared_ptr<Store> store_;
  mutable std::mutex mutex_;
  mutable std::condition_variable declared_;
  std::string reason_;
  std::function<void(const RendezvousEvent&)> on_event_;
};

}  // namespace dlaunch
