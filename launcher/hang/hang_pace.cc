#include "launcher/hang/hang_pace.h"

#include <fmt/format.h>

#include <algorithm>

namespace dlaunch {

bool HangPace::observe(int64_t worker, int pid, std::optional<TimePoint> beat, TimePoint now) {
  Worker& w = workers_[worker];
  if (w.pid != pid) w = Worker{pid, std::nullopt, 0, 0, std::nullopt};
  const bool late = w.checked && now - *w.checked > params_.late_check;
  w.checked = now;
  if (!beat) return false;
  bool grew = false;
  if (w.last && *beat > *w.last) {
    const Duration gap = *beat - *w.last;
    const Timeout in_force = timeout(worker);
    const bool warming_up = w.gaps < params_.worker_gaps || w.unlearned > 0;
    const bool suspect = in_force.learned && gap > in_force.value / 2;
    if (!warming_up && !suspect && !late && gap > longest_) {
      longest_ = gap;
      grew = true;
    }
    if (w.unlearned > 0) --w.unlearned;
    ++w.gaps;
    ++gaps_;
  }
  if (!w.last || *beat > *w.last) w.last = beat;
  return grew;
}

void HangPace::skip_current_gaps() {
  for (auto& [key, w] : workers_) {
    w.last.reset();
    w.unlearned = params_.worker_gaps;
  }
}

HangPace::Timeout HangPace::timeout(int64_t worker) const {
  Timeout t;
  t.longest_gap = longest_;
  t.group_gaps = gaps_;
  if (auto it = workers_.find(worker); it != workers_.end()) t.worker_gaps = it->second.gaps;
  t.learned = t.group_gaps >= params_.group_gaps && t.worker_gaps >= params_.worker_gaps;
  if (!t.learned) {
    t.value = params_.startup;
    return t;
  }
  const Duration scaled = std::chrono::duration_cast<Duration>(longest_ * params_.factor);
  t.value = std::max(params_.floor, scaled);
  return t;
}

std::string HangPace::describe(const Timeout& t) const {
  if (!t.learned) {
    return fmt::format("--hang_timeout auto: the start-up timeout, until the group showed {} "
                       "gaps between heartbeats ({} so far) and this worker {} ({})",
                       params_.group_gaps, t.group_gaps, params_.worker_gaps, t.worker_gaps);
  }
  const Duration scaled = std::chrono::duration_cast<Duration>(t.longest_gap * params_.factor);
  if (scaled < params_.floor) {
    return fmt::format("--hang_timeout auto: the floor of {:.1f} s ({:g} x the longest gap seen, "
                       "{:.2f} s, is less)",
                       to_seconds(params_.floor), params_.factor, to_seconds(t.longest_gap));
  }
  return fmt::format("--hang_timeout auto: {:g} x the longest gap seen, {:.2f} s", params_.factor,
                     to_seconds(t.longest_gap));
}

}  // namespace dlaunch
