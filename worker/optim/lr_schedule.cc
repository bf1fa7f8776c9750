#include "worker/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace dlaunch::optim {

LrScheduleKind parse_lr_schedule(const std::string& text) {
  if (text == "constant") return LrScheduleKind::kConstant;
  if (text == "step") return LrScheduleKind::kStep;
  if (text == "cosine") return LrScheduleKind::kCosine;
  if (text == "triangle") return LrScheduleKind::kTriangle;
  throw UsageError("--lr_schedule must be cosine, step, constant or triangle, got '" + text + "'");
}

double lr_at(const LrSchedule& s, double epochs) {
  epochs = std::max(0.0, epochs);
  if (s.warmup_epochs > 0 && epochs < s.warmup_epochs) return s.base_lr * epochs / s.warmup_epochs;
  const double t = epochs - std::max(0.0, s.warmup_epochs);
  switch (s.kind) {
    case LrScheduleKind::kConstant:
      return s.base_lr;
    case LrScheduleKind::kStep:
      return s.base_lr * std::pow(s.gamma, std::floor(t / std::max(1e-12, s.step_size)));
    case LrScheduleKind::kCosine:
    case LrScheduleKind::kTriangle: {
      const double span = s.total_epochs - std::max(0.0, s.warmup_epochs);
      if (span <= 0) return s.base_lr;
      const double frac = std::min(1.0, t / span);
      if (s.kind == LrScheduleKind::kTriangle) return s.base_lr * (1.0 - frac);
      return 0.5 * s.base_lr * (1.0 + std::cos(M_PI * frac));
    }
  }
  return s.base_lr;
}

}  // namespace dlaunch::optim
