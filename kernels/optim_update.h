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

inline AdamCorrection adam_correction(float lr, float beta1, float beta2, int64_t step) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
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

}  // namespace dlaunch::kernels
