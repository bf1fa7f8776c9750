// The mixed-precision helpers on the CPU: rounding to bf16/fp16 with kernels/dtype.h (the same
// functions the CUDA kernel calls), the loss scale, and the unscale-and-check of the gradients.
#include <cmath>

#include "kernels/ops.h"
#include "kernels/profile.h"

namespace dlaunch::kernels::cpu {

void round_to_dtype(int64_t n, Dtype dtype, const float* x, float* y) {
  ScopedOpTimer timer("round_to_dtype");
  // One loop per dtype so each vectorises without a branch per element.
  if (dtype == Dtype::kBF16) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = round_to_bf16(x[i]);
  } else if (dtype == Dtype::kF16) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = round_to_f16(x[i]);
  } else if (x != y) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i];
  }
}

void scale(int64_t n, float alpha, const float* x, float* y) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = alpha * x[i];
}

int64_t unscale_count_non_finite(int64_t n, float inv_scale, float* x) {
  ScopedOpTimer timer("unscale");
  int64_t bad = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : bad)
  for (int64_t i = 0; i < n; ++i) {
    bad += std::isfinite(x[i]) ? 0 : 1;
    x[i] *= inv_scale;
  }
  return bad;
}

}  // namespace dlaunch::kernels::cpu
