// An injectable monotonic clock, so state machines (rendezvous, heartbeats) can be unit-tested
// with a scripted time. Never blocks, never throws.
#pragma once

#include <chrono>

namespace dlaunch {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::steady_clock::time_point;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint now() const = 0;
};

class SteadyClock final : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
};

// The process-wide real clock.
const Clock& steady_clock();

// A clock that moves only when told to. Not thread-safe: tests drive it from one thread.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(TimePoint start = TimePoint{}) : now_(start) {}
  TimePoint now() const override { return now_; }
  void advance(Duration d) { now_ += d; }
  void set(TimePoint t) { now_ = t; }

 private:
  TimePoint now_;
};

// Seconds as a double, for messages and JSON.
inline double to_seconds(Duration d) { return std::chrono::duration<double>(d).count(); }
inline Duration from_seconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

// Saturating "steady now + d": a "forever" timeout (Duration::max()) must not overflow into a
// deadline in the past.
inline TimePoint deadline_after(Duration d) {
  auto now = std::chrono::steady_clock::now();
  if (d > TimePoint::max() - now) return TimePoint::max();
  return now + d;
}

// Milliseconds left until `deadline` on the steady clock, for poll(2): 0 once it passed, and at
// most 10^9 (an int).
inline int remaining_ms(TimePoint deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return 0;
  return left.count() > 1'000'000'000 ? 1'000'000'000 : static_cast<int>(left.count());
}

}  // namespace dlaunch
