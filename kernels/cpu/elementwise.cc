// Elementwise ops; layout-agnostic (they see a flat array of n floats).
#include "kernels/ops.h"

namespace dlaunch::kernels::cpu {

void relu_forward(int64_t n, const float* x, float* y) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

void relu_backward(int64_t n, const float* y, const float* dy, float* dx) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.f ? dy[i] : 0.f;
}

void add(int64_t n, const float* a, const float* b, float* y) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void add_relu_backward(int64_t n, const float* y, const float* dy, float* acc) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) acc[i] += y[i] > 0.f ? dy[i] : 0.f;
}

}  // namespace dlaunch::kernels::cpu
