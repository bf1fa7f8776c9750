// Optimizers over the model's flat parameter buffer, with PyTorch's semantics so results can be
// compared with torch.optim.SGD / torch.optim.Adam step for step:
//   SGD  (dampening 0): g = grad + wd * p; buf = first ? g : momentum * buf + g;
//                       g = nesterov ? g + momentum * buf : buf; p -= lr * g
//   Adam (not AdamW):   g = grad + wd * p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//                       p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Weight decay applies to every parameter unless OptimConfig::decay_bn_and_bias is false, in
// which case ParamInfo::no_weight_decay entries are exempt (PyTorch's default is to decay all).
// bn_lr_scale multiplies the learning rate of ParamInfo::batch_norm entries (a parameter group
// with lr * K in PyTorch), as fast CIFAR recipes do.
//
// State (momentum buffer, or Adam's m then v) is one flat buffer on the optimizer's backend,
// sized on the first step, so a checkpoint stores state() and step_count() (copied to the host)
// and restores them with load_state(). params and grads given to step() are that backend's
// memory. Not thread-safe; on the CPU step() blocks for the duration of the update (OpenMP team
// of the calling thread), on a GPU it queues the update.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "worker/model/param.h"
#include "worker/tensor.h"

namespace dlaunch::optim {

enum class OptimKind { kSgd, kAdam };

struct OptimConfig {
  OptimKind kind = OptimKind::kSgd;
  double momentum = 0.9;  // SGD
  bool nesterov = false;  // SGD; needs momentum > 0
  double weight_decay = 0.0;
  bool decay_bn_and_bias = true;  // false: skip ParamInfo::no_weight_decay parameters
  double bn_lr_scale = 1.0;       // learning rate x this for ParamInfo::batch_norm parameters
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // Adam
};

// "sgd" | "adam"; throws UsageError otherwise.
OptimKind parse_optim_kind(const std::string& text);

class Optimizer {
 public:
  // Throws UsageError for nesterov without momentum, negative lr/momentum/decay/bn_lr_scale,
  // betas outside [0,1).
  explicit Optimizer(const OptimConfig& config,
                     kernels::Backend& backend = kernels::cpu_backend());

  // One update of n parameters with learning rate lr. Empty infos mean "all decayed"; otherwise
  // the infos must tile [0, n) (they are only read for no_weight_decay and batch_norm). One
  // backend call either way: parameter groups go to the grouped op as segments, built at the
  // first step and kept in backend memory.
  void step(float* params, const float* grads, size_t n, float lr,
            const std::vector<model::ParamInfo>& infos);

  int64_t step_count() const { return step_count_; }
  // Momentum buffer (SGD) or m followed by v (Adam), copied to the host; empty before the
  // first step.
  std::vector<float> state() const { return state_.to_host(); }
  // Restores a checkpoint; state must be empty or the size state() had. Throws UsageError.
  void load_state(std::vector<float> state, int64_t step_count);
  const OptimConfig& config() const { return config_; }

 private:
  // Groups of the infos as segments of [0, n), neighbours of one group merged; false when every
  // parameter is in one group with the plain lr and weight decay (the plain op then takes them).
  bool build_segments(size_t n, const std::vector<model::ParamInfo>& infos);

  struct BackendFree {
    kernels::Backend* backend;
    void operator()(void* p) const { backend->free(p); }
  };

  OptimConfig config_;
  kernels::Backend& backend_;
  Tensor state_;
  int64_t step_count_ = 0;
  std::vector<kernels::OptimSegment> segments_;                        // for the n and infos below
  std::unique_ptr<void, BackendFree> segments_on_backend_{nullptr, {}};  // the same, in backend memory
  size_t segments_n_ = 0, segments_infos_ = 0;
};

}  // namespace dlaunch::optim
