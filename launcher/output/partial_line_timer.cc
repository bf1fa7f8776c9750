#include "launcher/output/partial_line_timer.h"

#include <algorithm>
#include <optional>

namespace dlaunch {

void PartialLineTimer::watch(const std::shared_ptr<WorkerOutput>& out) {
  waiting_.insert(out);
  if (!armed_) arm();
}

void PartialLineTimer::arm() {
  std::optional<TimePoint> due;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    auto out = it->lock();
    auto next = out ? out->next_due() : std::nullopt;
    if (!next) {
      it = waiting_.erase(it);
      continue;
    }
    if (!due || *next < *due) due = next;
    ++it;
  }
  armed_ = due.has_value();
  if (!due) return;
  timer_.expires_after(std::max<Duration>(*due - clock_.now(), std::chrono::milliseconds(1)));
  timer_.async_wait([this](const boost::system::error_code& ec) {
    armed_ = false;
    if (ec) return;
    TimePoint now = clock_.now();
    for (const auto& weak : waiting_) {
      if (auto out = weak.lock()) out->flush_due(now);
    }
    arm();
  });
}

}  // namespace dlaunch
