// --ema DECAY: an exponential moving average of the model's weights, evaluated in their place
// (timm's ModelEmaV2, airbench's and hlb-CIFAR10's EMA). After every `every`-th optimizer step
//   avg = d * avg + (1 - d) * w,   d = decay^every
// so the average's horizon in steps (about 1 / (1 - decay)) does not depend on `every` (hlb-CIFAR10
// raises its decay to the same power). With warm-up (--ema_warmup) the decay of optimizer step t is
// min(decay, (1 + t) / (10 + t)), TensorFlow's ExponentialMovingAverage with num_updates: early on
// the average follows the weights instead of holding on to the random initialisation for
// ~1 / (1 - decay) steps, which a short run never outlives. It averages the parameters AND the
// batch norm running statistics (timm and hlb-CIFAR10 average every float of the state dict): the
// averaged weights were never normalised by any one step's statistics, and statistics averaged over
// the same horizon belong to them better than the live model's, which follow its latest ~10 steps
// (BN momentum 0.1).
//
// Everything lives on the model's backend and is updated by its ema_update op: nothing crosses to
// the host. Data parallel: the parameters are the same on every rank after each step, so their
// average is too; the running statistics differ per rank without SyncBN, so the trainer
// broadcasts rank 0's averaged statistics wherever it broadcasts the model's (before evaluating
// and checkpointing), as DistributedDataParallel's broadcast_buffers does.
//
// Not thread-safe; calls queue work on the backend like the model's own.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/model/resnet.h"
#include "worker/tensor.h"

namespace dlaunch::optim {

class WeightEma {
 public:
  // Starts from the model's current parameters and running statistics. Throws UsageError for a
  // decay outside (0, 1) or every < 1.
  WeightEma(model::ResNet& model, double decay, int64_t every, bool warmup = false);

  // After the optimizer's step number `optimizer_steps` (its count so far, 1-based): averages
  // the model in when it is a multiple of `every`.
  void after_step(int64_t optimizer_steps);
  // The factor that update multiplies the average by: decay^every, or with warm-up
  // min(decay, (1 + t) / (10 + t))^every at t = optimizer_steps.
  float update_decay(int64_t optimizer_steps) const;
  // The average restarts from the model's current weights.
  void reset_from_model();

  // The averaged parameters followed by every averaged buffer, on the host: checkpoints.
  std::vector<float> state() const;
  size_t state_size() const;
  // Takes state() back. A wrong size fails DL_CHECK: the caller checks the checkpoint's array.
  void load_state(const std::vector<float>& values);

  std::vector<Tensor*> buffers();
  double decay() const { return decay_; }
  int64_t every() const { return every_; }
  bool warmup() const { return warmup_; }

  // While it lives, the model holds the averaged weights (evaluation); its own come back after.
  class Applied {
   public:
    explicit Applied(WeightEma& ema);
    ~Applied();
    Applied(const Applied&) = delete;
    Applied& operator=(const Applied&) = delete;

   private:
    WeightEma& ema_;
    Tensor params_;
    std::vector<Tensor> buffers_;
  };

 private:
  model::ResNet& model_;
  double decay_;
  int64_t every_;
  bool warmup_;
  Tensor params_;
  std::vector<Tensor> buffers_;  // in model.buffers() order
};

}  // namespace dlaunch::optim
