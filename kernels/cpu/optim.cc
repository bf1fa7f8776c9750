// Optimizer steps on the CPU: the element updates of optim_update.h over every parameter.
#include "kernels/ops.h"
#include "kernels/optim_update.h"
#include "kernels/profile.h"

namespace dlaunch::kernels::cpu {

void sgd_step(int64_t n, float* p, const float* grad, float* buf, float lr, float momentum,
              bool nesterov, float weight_decay, bool first) {
  ScopedOpTimer timer("sgd_step");
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    sgd_update(p[i], grad[i], buf[i], lr, momentum, nesterov, weight_decay, first);
  }
}

void adam_step(int64_t n, float* p, const float* grad, float* m, float* v, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step) {
  ScopedOpTimer timer("adam_step");
  const AdamCorrection k = adam_correction(lr, beta1, beta2, step);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    adam_update(p[i], grad[i], m[i], v[i], k, beta1, beta2, eps, weight_decay);
  }
}

}  // namespace dlaunch::kernels::cpu
