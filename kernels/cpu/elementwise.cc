// Elementwise ops; layout-agnostic (they see a flat array of n floats).
#include "kernels/ops.h"
#include "kernels/profile.h"

namespace dlaunch::kernels::cpu {

void relu_forward(int64_t n, const float* x, float* y) {
  ScopedOpTimer timer("relu");
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

void relu_backward(int64_t n, const float* y, const float* dy, float* dx) {
  ScopedOpTimer timer("relu_backward");
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.f ? dy[i] : 0.f;
}

void add(int64_t n, const float* a, const float* b, float* y) {
  ScopedOpTimer timer("add");
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void add_relu_backward(int64_t n, const float* y, const float* dy, float* acc) {
  ScopedOpTimer timer("add_relu_backward");
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) acc[i] += y[i] > 0.f ? dy[i] : 0.f;
}

void fill(int64_t n, float value, float* y) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = value;
}

}  // namespace dlaunch::kernels::cpu
