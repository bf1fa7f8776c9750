// The dynamic loss scale of fp16 training, with torch.cuda.amp.GradScaler's semantics and
// defaults (torch/amp/grad_scaler.py and _amp_update_scale_ in ATen's AmpKernels.cu):
//
//   the loss (in practice its gradient) is multiplied by scale() before backward; after the
//   gradients are reduced they are unscaled and checked; then update(found_inf):
//     found_inf:  the optimizer step is SKIPPED, scale *= backoff_factor (0.5), tracker = 0
//     otherwise:  tracker + 1 == growth_interval (2000) ? scale *= growth_factor (2) when the
//                 result is a finite float, tracker = 0 : ++tracker
//   starting from init_scale 65536 (2^16). The scale is a float, like PyTorch's fp32 tensor.
//
// Pure logic (no device, no clock): unit-tested as a table. The state (scale, tracker) goes in
// checkpoints (GradScaler.state_dict() holds the same two plus the constant factors).
#pragma once

#include <cstdint>

namespace dlaunch::optim {

struct GradScalerConfig {
  float init_scale = 65536.0f;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 2000;
};

struct GradScalerState {
  float scale = 65536.0f;
  int64_t growth_tracker = 0;  // consecutive steps without inf/NaN since the last change
};

class GradScaler {
 public:
  explicit GradScaler(const GradScalerConfig& config = {});

  float scale() const { return state_.scale; }
  // After each step (the caller skips the optimizer step itself when found_inf), with whether its (reduced) gradients held an inf or NaN.
  void update(bool found_inf);

  const GradScalerState& state() const { return state_; }
  // From a checkpoint. Throws UsageError for a scale that is not a positive finite number or a
  // negative tracker (a damaged checkpoint, said with the values found).
  void load_state(const GradScalerState& state);
  const GradScalerConfig& config() const { return config_; }

 private:
  GradScalerConfig config_;
  GradScalerState state_;
};

}  // namespace dlaunch::optim
