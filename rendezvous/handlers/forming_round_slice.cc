#include "rendezvous/handlers/forming_round_slice.h"

#include <algorithm>

namespace dlaunch {
namespace {

// How often the first arrival re-reads the count while a round forms: wake-up keys end most
// waits early; this bounds the last-call measurement error.
Duration poll_interval(Duration last_call_timeout) {
  return std::clamp<Duration>(last_call_timeout / 5, std::chrono::milliseconds(10),
                              std::chrono::milliseconds(250));
}

}  // namespace

Duration forming_round_slice(const DynamicLimits* limits, bool measures_last_call, int64_t count,
                             TimePoint changed_at, Duration keep_alive_interval, TimePoint now,
                             TimePoint until) {
  Duration sleep = std::min<Duration>(keep_alive_interval, std::chrono::seconds(1));
  if (limits && measures_last_call) {
    sleep = poll_interval(limits->last_call_timeout);
    if (count >= limits->min_nodes) {
      TimePoint last_call = changed_at + limits->last_call_timeout;
      sleep = std::min<Duration>(sleep, std::max<Duration>(last_call - now, Duration(0)));
    }
  }
  return std::min<Duration>(sleep, until - now);
}

}  // namespace dlaunch
