#include "launcher/output/console_fold.h"

#include <fmt/format.h>

#include <algorithm>

namespace dlaunch {

std::string folded_prefix(const std::string& role, std::vector<int64_t> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string list;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!list.empty()) list += ',';
    list += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return fmt::format("[{}{}]:", role, list);
}

void ConsoleFold::line(int64_t rank, std::string_view text, std::string_view stamp, TimePoint now,
                       std::string& out) {
  size_t from = 0;  // right after this rank's previous line, if that is still held
  if (auto it = last_.find(rank); it != last_.end()) {
    for (size_t i = 0; i < held_.size(); ++i) {
      if (held_[i].id == it->second) from = i + 1;
    }
  }
  size_t at = from;
  while (at < held_.size() && held_[at].text != text) ++at;
  if (at < held_.size()) {
    held_[at].ranks.push_back(rank);
    held_[at].latest = now;
  } else {
    at = stamp.empty() ? from : held_.size();
    held_.insert(held_.begin() + static_cast<std::ptrdiff_t>(at),
                 Fold{std::string(text), std::string(stamp), {rank}, now, now, next_id_++});
  }
  last_[rank] = held_[at].id;
  while (!held_.empty() && (held_.front().ranks.size() >= shown_ || held_.size() > kMaxHeld)) {
    emit_head(out);
  }
}

void ConsoleFold::emit_head(std::string& out) {
  const Fold& f = held_.front();
  out += f.stamp;
  out += folded_prefix(role_, f.ranks);
  out += f.text;
  out += '\n';
  held_.pop_front();
}

void ConsoleFold::flush(std::string& out) {
  while (!held_.empty()) emit_head(out);
}

void ConsoleFold::finish_rank(std::string& out) {
  if (++finished_ >= shown_) flush(out);
}

void ConsoleFold::flush_due(TimePoint now, Duration min_age, std::string& out) {
  while (auto first_due = pending_since(min_age)) {
    if (now - *first_due < min_age && held_.front().ranks.size() < shown_) return;
    emit_head(out);
  }
}

TimePoint ConsoleFold::wait_began(const Fold& f, Duration min_age) {
  return std::min(f.latest, f.since + kMaxWait - min_age);
}

std::optional<TimePoint> ConsoleFold::pending_since(Duration min_age) const {
  std::optional<TimePoint> first;
  for (const auto& f : held_) {
    const TimePoint began = wait_began(f, min_age);
    if (!first || began < *first) first = began;
  }
  return first;
}

}  // namespace dlaunch
