#include "worker/train/divergence.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

namespace dlaunch::train {

DivergenceCheck::DivergenceCheck(const TrainConfig& config, bool check_loss, int64_t global_step)
    : config_(config),
      check_loss_(check_loss),
      loss_finite_at_(global_step),
      weights_finite_at_(global_step) {}

void DivergenceCheck::check(int64_t global_step, std::optional<double> loss_sum,
                            std::optional<double> bad_weights) {
  const bool loss_bad = loss_sum && check_loss_ && !std::isfinite(*loss_sum);
  const bool weights_bad = bad_weights && *bad_weights > 0;
  if (!loss_bad && !weights_bad) {
    if (loss_sum) loss_finite_at_ = global_step;
    if (bad_weights) weights_finite_at_ = global_step;
    return;
  }
  throw DivergedError(fmt::format(
      "training diverged: the {} became {} between step {} and step {} (--lr {}, --precision "
      "{}); stopped without writing a checkpoint of it (those in {} are from before): resume "
      "from them with a lower --lr, more --warmup_epochs or another --precision",
      loss_bad ? "training loss" : "weights",
      loss_bad ? fmt::format("{}", *loss_sum) : std::string("inf or NaN"),
      loss_bad ? loss_finite_at_ : weights_finite_at_, global_step, config_.lr, config_.precision,
      config_.output_dir));
}

}  // namespace dlaunch::train
