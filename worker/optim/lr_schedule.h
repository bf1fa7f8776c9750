// Learning-rate schedules as pure functions of training progress measured in epochs (fractional:
// epoch + step_in_epoch / steps_per_epoch), so they resume exactly from a checkpoint.
//
//   warmup:   epochs < warmup_epochs  -> base_lr * epochs / warmup_epochs (linear from 0)
//   constant: base_lr
//   step:     base_lr * gamma^floor((epochs - warmup) / step_size)
//   cosine:   0.5 * base_lr * (1 + cos(pi * (epochs - warmup) / (total - warmup))), reaching 0
//             at total_epochs (PyTorch's CosineAnnealingLR with eta_min 0, evaluated per step)
//   triangle: base_lr * (1 - (epochs - warmup) / (total - warmup)): with the warm-up, a straight
//             line up from 0 to the peak and down to 0 at total_epochs (airbench's schedule;
//             without warm-up a linear decay from base_lr)
#pragma once

#include <string>

namespace dlaunch::optim {

enum class LrScheduleKind { kConstant, kStep, kCosine, kTriangle };

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kCosine;
  double base_lr = 0.1;
  double warmup_epochs = 0;
  double total_epochs = 1;
  double step_size = 30;  // step: epochs between decays
  double gamma = 0.1;     // step: decay factor
};

// "constant" | "step" | "cosine" | "triangle"; throws UsageError otherwise.
LrScheduleKind parse_lr_schedule(const std::string& text);
// The learning rate after `epochs` epochs of training (>= 0).
double lr_at(const LrSchedule& schedule, double epochs);

}  // namespace dlaunch::optim
