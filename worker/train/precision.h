// What --precision changes in dtrain's training step, in one place for every device:
//   fp32  nothing (loss_scale() is 1, finish_step() touches nothing and says "step");
//   bf16  the model rounds to bf16 (ResNetConfig::precision); no loss scaling, like autocast
//         with bfloat16 (its range is fp32's);
//   fp16  the model rounds to fp16, and a dynamic loss scale (GradScaler, PyTorch's semantics)
//         keeps small gradients from flushing to zero: the loss gradient is multiplied by
//         loss_scale() before backward; after the gradient all-reduce finish_step() unscales the
//         gradients, checks them for inf/NaN, skips the optimizer step when there are any and
//         updates the scale. The all-reduce spreads an inf or NaN to every rank, so every rank
//         skips the same steps and keeps the same scale without another collective.
// The scaler's state goes in checkpoints (state_json / load_state_json; a checkpoint without it
// starts from the initial scale). Not thread-safe: the training thread's.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/backend.h"
#include "worker/optim/grad_scaler.h"

namespace dlaunch::train {

class MixedPrecision {
 public:
  MixedPrecision(kernels::Dtype dtype, kernels::Backend& backend);

  bool loss_scaling() const { return dtype_ == kernels::Dtype::kF16; }
  // The factor for the loss gradient before backward (1 without loss scaling).
  float loss_scale() const { return loss_scaling() ? scaler_.scale() : 1.0f; }
  // After backward and the all-reduce of `grads` (n floats on the backend): whether to run the
  // optimizer step. fp16: unscales them, and on inf/NaN says skip; the scale is updated either
  // way. Synchronises with the device (one host value) only with loss scaling.
  bool finish_step(float* grads, size_t n);
  // Optimizer steps skipped for inf/NaN gradients in this process.
  int64_t skipped_steps() const { return skipped_; }

  // {"scale": s, "growth_tracker": t} (null without loss scaling), for the checkpoint meta.
  nlohmann::json state_json() const;
  // From a checkpoint's meta entry; null or absent (an older checkpoint, or one of another
  // precision) keeps the initial state. Throws UsageError for a malformed entry.
  void load_state_json(const nlohmann::json& state);

  // The start-up log line: the precision, and on the CPU that it is emulated.
  std::string describe() const;

 private:
  kernels::Dtype dtype_;
  kernels::Backend& backend_;
  optim::GradScaler scaler_;
  int64_t skipped_ = 0;
};

}  // namespace dlaunch::train
