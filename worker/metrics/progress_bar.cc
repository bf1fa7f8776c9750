#include "worker/metrics/progress_bar.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace dlaunch::metrics {

bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

ProgressBar::ProgressBar(bool enabled) : enabled_(enabled) {}

void ProgressBar::update(int64_t epoch, int64_t step, int64_t total, double loss,
                         double images_per_s) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (drawn_ && step < total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  constexpr int kWidth = 30;
  int filled = total > 0 ? static_cast<int>(kWidth * step / total) : 0;
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  std::string line = fmt::format("\r\033[Kepoch {} [{}] {}/{}  loss {:.4f}  {:.0f} img/s", epoch,
                                 bar, step, total, loss, images_per_s);
  std::fputs(line.c_str(), stdout);
  std::fflush(stdout);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (!enabled_ || !drawn_) return;
  std::fputs("\r\033[K", stdout);
  std::fflush(stdout);
  drawn_ = false;
}

}  // namespace dlaunch::metrics
