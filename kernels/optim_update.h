// One element's update of torch.optim's SGD and Adam, with the operation order of PyTorch 1.13's
// single-tensor path (foreach=False), so float results match it closely. The CPU loop
// (cpu/optim.cc) and the CUDA kernel (cuda/optim.cu) both call these, so the devices agree too.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/dtype.h"  // DL_HOST_DEVICE

namespace dlaunch::kernels {

DL_HOST_DEVICE void sgd_update(float& p, float grad, float& buf, float lr, float momentum,
                               bool nesterov, float weight_decay, bool first) {
  float g = grad;
  if (weight_decay != 0.f) g = g + weight_decay * p;
  if (momentum != 0.f) {
    const float b = first ? g : momentum * buf + g;
    buf = b;
    g = nesterov ? g + momentum * b : b;
  }
  p = p - lr * g;
}

// Adam's bias corrections at `step` (1-based), computed once per step in double as torch does.
struct AdamCorrection {
  float step_size;  // lr / (1 - beta1^step)
  float bc2_sqrt;   // sqrt(1 - beta2^step)
};

inline double adam_bc1(float beta1, int64_t step) {
  return 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
}

inline AdamCorrection adam_correction(float lr, float beta1, float beta2, int64_t step) {
  const double bc1 = adam_bc1(beta1, step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  return {static_cast<float>(lr / bc1), static_cast<float>(std::sqrt(bc2))};
}

DL_HOST_DEVICE void adam_update(float& p, float grad, float& m, float& v, AdamCorrection k,
                                float beta1, float beta2, float eps, float weight_decay) {
  float g = grad;
  if (weight_decay != 0.f) g = g + weight_decay * p;
  m = m * beta1 + (1.f - beta1) * g;
  v = v * beta2 + (1.f - beta2) * g * g;
  const float denom = sqrtf(v) / k.bc2_sqrt + eps;
  p = p - k.step_size * m / denom;
}

// A run [begin, end) of the flat parameters that one parameter group covers (--bn_lr_scale,
// --no_bn_weight_decay: PyTorch's param_groups), for the grouped steps (sgd_step_grouped,
// adam_step_grouped): one call and one kernel for every group instead of one per tensor.
struct OptimSegment {
  int64_t begin = 0;
  int64_t end = 0;
  double lr_scale = 1.0;  // the group's lr is float(double(lr) * lr_scale), as the host computed it
  float weight_decay = 0.f;
};

DL_HOST_DEVICE float segment_lr(float lr, const OptimSegment& s) {
  return static_cast<float>(static_cast<double>(lr) * s.lr_scale);
}

// The segment holding element i, by binary search: `segments` tile [0, n) in order.
DL_HOST_DEVICE const OptimSegment& segment_of(const OptimSegment* segments, int64_t count, int64_t i) {
  int64_t lo = 0, hi = count - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (segments[mid].begin <= i) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return segments[lo];
}

// Adam's step size for a group's lr: float(lr / (1 - beta1^step)), in double as
// adam_correction computes it; `bc1` = 1 - beta1^step.
DL_HOST_DEVICE float adam_step_size(float lr, double bc1) {
  return static_cast<float>(static_cast<double>(lr) / bc1);
}

}  // namespace dlaunch::kernels
