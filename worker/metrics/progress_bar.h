// A one-line live progress bar for rank 0 when stdout is a terminal, directly or through dlaunch
// (which says so with DLAUNCH_CONSOLE_TTY=1): "\r" redraws, at most 10 times a second. Does
// nothing when stdout is a file or pipe, so logs stay clean. Not thread-safe; never blocks
// beyond the terminal write.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dlaunch::metrics {

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled);
  // Redraws "epoch e [#####.....] step/total  loss x  N img/s".
  void update(int64_t epoch, int64_t step, int64_t total, double loss, double images_per_s);
  // Clears the bar so the next printed line starts clean.
  void clear();
  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

// True when rank 0 should draw: stdout is a TTY.
bool stdout_is_terminal();

}  // namespace dlaunch::metrics
