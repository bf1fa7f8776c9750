// Optimizer updates with the exact operation order of torch.optim (single-tensor, foreach=False
// path of PyTorch 1.13), so float results match it closely.
#include <cmath>

#include "kernels/ops.h"
#include "kernels/profile.h"

namespace dlaunch::kernels::cpu {

void sgd_step(int64_t n, float* p, const float* grad, float* buf, float lr, float momentum,
              bool nesterov, float weight_decay, bool first) {
  ScopedOpTimer timer("sgd_step");
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i];
    if (weight_decay != 0.f) g = g + weight_decay * p[i];
    if (momentum != 0.f) {
      const float b = first ? g : momentum * buf[i] + g;
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    p[i] = p[i] - lr * g;
  }
}

void adam_step(int64_t n, float* p, const float* grad, float* m, float* v, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step) {
  ScopedOpTimer timer("adam_step");
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  const float step_size = static_cast<float>(lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i];
    if (weight_decay != 0.f) g = g + weight_decay * p[i];
    m[i] = m[i] * beta1 + (1.f - beta1) * g;
    v[i] = v[i] * beta2 + (1.f - beta2) * g * g;
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] - step_size * m[i] / denom;
  }
}

}  // namespace dlaunch::kernels::cpu
