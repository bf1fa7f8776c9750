#include "worker/train/startup_phases.h"

#include <atomic>
#include <chrono>

#include "common/log.h"

namespace dlaunch::train {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<Clock::rep> begin_ticks{0};

}  // namespace

void mark_startup_begin() { begin_ticks = Clock::now().time_since_epoch().count(); }

void log_startup_phase(std::string_view phase) {
  if (log_level() > LogLevel::kDebug) return;
  const Clock::time_point begin{Clock::duration{begin_ticks.load()}};
  log_debug("start-up: {} at +{:.0f} ms", phase,
            1e3 * std::chrono::duration<double>(Clock::now() - begin).count());
}

}  // namespace dlaunch::train
