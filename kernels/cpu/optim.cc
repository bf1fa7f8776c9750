// Optimizer steps on the CPU: the element updates of optim_update.h over every parameter.
#include "kernels/ops.h"
#include "kernels/optim_update.h"
#include "kernels/profile.h"
#include "common/error.h"

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

void sgd_step_grouped(int64_t count, const OptimSegment* segments, int64_t n, float* p,
                      const float* grad, float* buf, float lr, float momentum, bool nesterov, bool first) {
  ScopedOpTimer timer("sgd_step_grouped");
  for (int64_t s = 0; s < count; ++s) {
    const OptimSegment& seg = segments[s];
    DL_CHECK(seg.begin >= 0 && seg.begin <= seg.end && seg.end <= n) << "segment " << s;
    const float seg_lr = segment_lr(lr, seg);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = seg.begin; i < seg.end; ++i) {
      sgd_update(p[i], grad[i], buf[i], seg_lr, momentum, nesterov, seg.weight_decay, first);
    }
  }
}

void adam_step_grouped(int64_t count, const OptimSegment* segments, int64_t n, float* p,
                       const float* grad, float* m, float* v, float lr, float beta1, float beta2,
                       float eps, int64_t step) {
  ScopedOpTimer timer("adam_step_grouped");
  AdamCorrection k = adam_correction(lr, beta1, beta2, step);
  const double bc1 = adam_bc1(beta1, step);
  for (int64_t s = 0; s < count; ++s) {
    const OptimSegment& seg = segments[s];
    DL_CHECK(seg.begin >= 0 && seg.begin <= seg.end && seg.end <= n) << "segment " << s;
    k.step_size = adam_step_size(segment_lr(lr, seg), bc1);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = seg.begin; i < seg.end; ++i) {
      adam_update(p[i], grad[i], m[i], v[i], k, beta1, beta2, eps, seg.weight_decay);
    }
  }
}

}  // namespace dlaunch::kernels::cpu
