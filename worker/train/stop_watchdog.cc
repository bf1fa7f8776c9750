#include "worker/train/stop_watchdog.h"

#include <fmt/format.h>

#include <algorithm>

namespace dlaunch::train {

StopWatchdog::StopWatchdog(const Clock& clock, int64_t steps_per_check,
                           std::optional<Duration> grace)
    : clock_(clock), steps_per_check_(std::max<int64_t>(1, steps_per_check)), grace_(grace) {}

void StopWatchdog::progress(bool step) {
  const TimePoint now = clock_.now();
  std::lock_guard<std::mutex> lock(mu_);
  last_progress_ = now;
  if (!step) {
    // An evaluation in between: the next interval is no step's length.
    last_step_.reset();
    return;
  }
  if (last_step_) {
    steps_.push_back(now - *last_step_);
    if (steps_.size() > kStepsKept) steps_.pop_front();
  }
  last_step_ = now;
}

void StopWatchdog::stop_requested() {
  const TimePoint now = clock_.now();
  std::lock_guard<std::mutex> lock(mu_);
  if (!requested_) requested_ = now;
}

void StopWatchdog::settle() {
  std::lock_guard<std::mutex> lock(mu_);
  settled_ = true;
}

std::optional<TimePoint> StopWatchdog::deadline() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!requested_ || settled_) return std::nullopt;
  const std::optional<Duration> bound = bound_locked();
  if (!bound) return std::nullopt;
  // The wait starts at the request, or at the latest progress after it.
  const TimePoint since = last_progress_ ? std::max(*requested_, *last_progress_) : *requested_;
  return since + *bound;
}

std::optional<Duration> StopWatchdog::bound() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bound_locked();
}

std::optional<TimePoint> StopWatchdog::requested_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requested_;
}

std::string StopWatchdog::explain_bound() const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::optional<Duration> step = longest_step_locked();
  const std::optional<Duration> cap = cap_locked();
  const std::string grace = grace_ ? fmt::format("{:.0f}% of the launcher's {:.1f} s grace",
                                                 100 * kGraceShare, to_seconds(*grace_))
                                   : std::string();
  if (!step) {
    return cap ? grace + " (no step timed yet)" : "none (no step timed yet, no launcher's grace)";
  }
  const Duration steps = *step * (steps_per_check_ + 2);
  std::string text = fmt::format("{} x the longest recent step ({:.2f} s) = {:.2f} s",
                                 steps_per_check_ + 2, to_seconds(*step), to_seconds(steps));
  const Duration bound = *bound_locked();
  if (cap && bound == *cap && steps != *cap) return text + ", capped at " + grace;
  if (steps < kFloor) text += fmt::format(", raised to the {:.1f} s floor", to_seconds(kFloor));
  return text;
}

std::optional<Duration> StopWatchdog::longest_step_locked() const {
  if (steps_.empty()) return std::nullopt;
  return *std::max_element(steps_.begin(), steps_.end());
}

std::optional<Duration> StopWatchdog::cap_locked() const {
  if (!grace_) return std::nullopt;
  return std::chrono::duration_cast<Duration>(*grace_ * kGraceShare);
}

std::optional<Duration> StopWatchdog::bound_locked() const {
  const std::optional<Duration> step = longest_step_locked();
  const std::optional<Duration> cap = cap_locked();
  if (!step) return cap;
  const Duration bound = std::max(kFloor, *step * (steps_per_check_ + 2));
  return cap ? std::min(bound, *cap) : bound;
}

}  // namespace dlaunch::train
