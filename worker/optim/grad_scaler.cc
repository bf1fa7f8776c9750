#include "worker/optim/grad_scaler.h"

#include <cmath>
#include <string>

#include "common/error.h"

namespace dlaunch::optim {

GradScaler::GradScaler(const GradScalerConfig& config) : config_(config) {
  state_.scale = config.init_scale;
}

void GradScaler::update(bool found_inf) {
  if (found_inf) {
    state_.scale *= config_.backoff_factor;
    state_.growth_tracker = 0;
    return;
  }
  const int64_t successful = state_.growth_tracker + 1;
  if (successful == config_.growth_interval) {
    // PyTorch keeps the old scale when growing would overflow the float.
    const float grown = state_.scale * config_.growth_factor;
    if (std::isfinite(grown)) state_.scale = grown;
    state_.growth_tracker = 0;
  } else {
    state_.growth_tracker = successful;
  }
}

void GradScaler::load_state(const GradScalerState& state) {
  if (!(std::isfinite(state.scale) && state.scale > 0) || state.growth_tracker < 0) {
    throw UsageError("the loss scaler state must have a positive finite scale and a growth "
                     "tracker >= 0, found scale " + std::to_string(state.scale) + " and tracker " +
                     std::to_string(state.growth_tracker) +
                     "; the checkpoint is damaged: resume from another one");
  }
  state_ = state;
}

}  // namespace dlaunch::optim
