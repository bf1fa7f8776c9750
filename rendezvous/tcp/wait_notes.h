// When a node waiting at the rendezvous says so again: 5, 10, 20, 40... s after it began, so
// it is never silent for long, and a long wait is a few lines, not a flood. Both handlers
// (static_rendezvous.h, dynamic_rendezvous.h) say it this way, and so do the waits before
// them: for the store's host to come up (tcp_store_client.h) and for its name to resolve
// (name_wait.h).
#pragma once

#include <chrono>
#include <string>

#include "common/clock.h"

namespace dlaunch {

class WaitNotes {
 public:
  // `first`: when the first note is due; each later one is due twice as long after `start`.
  explicit WaitNotes(TimePoint start, Duration first = std::chrono::seconds(5))
      : start_(start), next_(first) {}
  // True when a note is due at `now`; the next one is then due twice as late.
  bool due(TimePoint now);
  // "for 10 s of the 600 s join timeout"
  std::string how_long(TimePoint now, Duration join_timeout) const;

 private:
  TimePoint start_;
  Duration next_;
};

}  // namespace dlaunch
