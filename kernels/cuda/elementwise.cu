#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace dlaunch::kernels::cuda {
namespace {

__global__ void relu_kernel(int64_t n, const float* x, float* y) {
  DL_GRID_LOOP(i, n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
__global__ void relu_backward_kernel(int64_t n, const float* y, const float* dy, float* dx) {
  DL_GRID_LOOP(i, n) dx[i] = y[i] > 0.f ? dy[i] : 0.f;
}
__global__ void add_kernel(int64_t n, const float* a, const float* b, float* y) {
  DL_GRID_LOOP(i, n) y[i] = a[i] + b[i];
}
__global__ void add_relu_backward_kernel(int64_t n, const float* y, const float* dy, float* acc) {
  DL_GRID_LOOP(i, n) acc[i] += y[i] > 0.f ? dy[i] : 0.f;
}
__global__ void fill_kernel(int64_t n, float value, float* y) { DL_GRID_LOOP(i, n) y[i] = value; }

}  // namespace

void fill(int64_t n, float value, float* y) {
  fill_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, value, y);
  DL_CUDA_LAUNCH_CHECK();
}

void relu_forward(int64_t n, const float* x, float* y) {
  relu_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, x, y);
  DL_CUDA_LAUNCH_CHECK();
}
void relu_backward(int64_t n, const float* y, const float* dy, float* dx) {
  relu_backward_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, y, dy, dx);
  DL_CUDA_LAUNCH_CHECK();
}
void add(int64_t n, const float* a, const float* b, float* y) {
  add_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, a, b, y);
  DL_CUDA_LAUNCH_CHECK();
}
void add_relu_backward(int64_t n, const float* y, const float* dy, float* acc) {
  add_relu_backward_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, y, dy, acc);
  DL_CUDA_LAUNCH_CHECK();
}

}  // namespace dlaunch::kernels::cuda
