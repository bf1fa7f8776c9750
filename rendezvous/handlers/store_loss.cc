#include "rendezvous/handlers/store_loss.h"

#include <utility>

namespace dlaunch {

std::string StoreLoss::reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reason_;
}

void StoreLoss::wait_for(Duration d) const {
  std::unique_lock<std::mutex> lock(mutex_);
  declared_.wait_for(lock, d, [&] { return !reason_.empty(); });
}

void StoreLoss::declare(const std::string& reason) {
  std::function<void(const RendezvousEvent&)> on_event;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!reason_.empty()) return;
    reason_ = reason;
    on_event = on_event_;
  }
  declared_.notify_all();
  // End a call blocked on the dead store (a round, a restart request, a settle).
  store_->interrupt();
  if (on_event) on_event(RendezvousEvent{RendezvousEvent::Kind::kStoreLost, reason});
}

std::string StoreLoss::tell(std::function<void(const RendezvousEvent&)> on_event) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_event_ = std::move(on_event);
  return reason_;
}

}  // namespace dlaunch
