// When an armed dtrain gives up waiting for its step boundary after a stop signal
// (stop_signal.h; docs/dtrain.md, "Preemption").
//
// A stop signal is honoured after the step in progress, where the ranks agree to stop and write
// a checkpoint. A worker blocked in a collective with a lost peer (a SIGSTOPped or cut-off node)
// never gets there, and without a bound would sit out the signal until the launcher's SIGKILL
// after --shutdown_grace, on every re-form. The watchdog bounds that wait. Once a
// stop is requested, the worker is given up on when nothing progressed (no step ended, no
// evaluation batch) for
//
//   bound = clamp((steps_per_check + 2) x step time, kFloor, kGraceShare x grace)
//
// where the step time is the longest of the last kStepsKept step-to-step intervals with no
// evaluation between them (a loaded host's slow steps widen it rather than cause a false alarm),
// and the grace is the launcher's (DLAUNCH_SHUTDOWN_GRACE): giving up before the launcher's SIGKILL
// leaves the reason in the log. Before two steps are timed the bound is the grace's share; with
// neither, nothing is given up on. Progress restarts the wait, so a worker that trains or evaluates
// is never cut short; settle() ends the watch where the worker finishes on its own (the ranks
// agreed to stop, or training is over).
//
// Thread-safe: the training thread reports progress, the signal thread asks for the deadline.
// Never blocks beyond a mutex, never throws. Time comes from an injected clock (tests script it).
//
//   idle --stop_requested--> watching --(no progress for `bound`)--> given up: the caller exits
//     |                         |
//     +---------settle----------+--> settled: the worker ends by itself
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "common/clock.h"

namespace dlaunch::train {

class StopWatchdog {
 public:
  // No bound below this: a healthy step on a loaded 2-core host stalls for hundreds of ms.
  static constexpr Duration kFloor = std::chrono::seconds(1);
  // The part of the launcher's grace the watchdog may use, the rest left for logging and exiting
  // before the launcher's SIGKILL.
  static constexpr double kGraceShare = 0.8;
  // Enough steps to hold a periodic slow one (dtrain's flash copy every 20 steps by default).
  static constexpr size_t kStepsKept = 32;

  // `steps_per_check`: steps between two stop agreements (DTRAIN_STOP_CHECK_EVERY); `grace`:
  // the launcher's --shutdown_grace, none when not known (not under dlaunch).
  StopWatchdog(const Clock& clock, int64_t steps_per_check, std::optional<Duration> grace);

  // Training thread: a step ended (step = true) or other progress was made (an evaluation batch).
  void progress(bool step);
  // Signal thread: a stop was requested. Later calls change nothing.
  void stop_requested();
  // Training thread: the worker ends by itself from here (the ranks agreed to stop, or training
  // is over): nothing to give up on any more.
  void settle();

  // While watching, when to give up unless progress comes first; else nullopt (nothing to
  // watch: no request, settled, or no bound known).
  std::optional<TimePoint> deadline() const;
  // The wait allowed without progress now; nullopt when none is known.
  std::optional<Duration> bound() const;
  // When the stop was requested; nullopt before.
  std::optional<TimePoint> requested_at() const;
  // How bound() came about, for the log: "3 x the longest recent step (0.08 s) = 0.24 s,
  // raised to the 1.0 s floor", "80% of the launcher's 5.0 s grace (no step timed yet)".
  std::string explain_bound() const;

 private:
  std::optional<Duration> longest_step_locked() const;
  std::optional<Duration> cap_locked() const;
  std::optional<Duration> bound_locked() const;

  const Clock& clock_;
  const int64_t steps_per_check_;
  const std::optional<Duration> grace_;
  mutable std::mutex mu_;
  std::optional<TimePoint> last_step_;
  std::optional<TimePoint> last_progress_;
  std::deque<Duration> steps_;  // the last kStepsKept step-to-step intervals
  std::optional<TimePoint> requested_;
  bool settled_ = false;
};

}  // namespace dlaunch::train
