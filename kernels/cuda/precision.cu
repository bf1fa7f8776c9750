// The mixed-precision helpers on CUDA, with the rounding of kernels/dtype.h compiled for the
// device: a value rounds to the same bf16/fp16 number here as on the CPU (the tests compare the
// two bit for bit on a GPU machine).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace dlaunch::kernels::cuda {
namespace {

// One instantiation per dtype: no per-element branch on it.
template <Dtype D>
__global__ void round_kernel(int64_t n, const float* x, float* y) {
  DL_GRID_LOOP(i, n) y[i] = kernels::round_to_dtype(D, x[i]);
}
__global__ void scale_kernel(int64_t n, float alpha, const float* x, float* y) {
  DL_GRID_LOOP(i, n) y[i] = alpha * x[i];
}
__global__ void unscale_kernel(int64_t n, float inv_scale, float* x, unsigned long long* bad) {
  unsigned long long mine = 0;
  DL_GRID_LOOP(i, n) {
    mine += isfinite(x[i]) ? 0 : 1;
    x[i] *= inv_scale;
  }
  if (mine != 0) atomicAdd(bad, mine);
}

}  // namespace

void round_to_dtype(int64_t n, Dtype dtype, const float* x, float* y) {
  if (dtype == Dtype::kBF16) {
    round_kernel<Dtype::kBF16><<<detail::blocks_for(n), detail::kThreads>>>(n, x, y);
  } else if (dtype == Dtype::kF16) {
    round_kernel<Dtype::kF16><<<detail::blocks_for(n), detail::kThreads>>>(n, x, y);
  } else {
    if (x != y) DL_CUDA_CHECK(cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice));
    return;
  }
  DL_CUDA_LAUNCH_CHECK();
}

void scale(int64_t n, float alpha, const float* x, float* y) {
  scale_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, alpha, x, y);
  DL_CUDA_LAUNCH_CHECK();
}

int64_t unscale_count_non_finite(int64_t n, float inv_scale, float* x) {
  auto* bad = static_cast<unsigned long long*>(detail::workspace(sizeof(unsigned long long)));
  DL_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof *bad));
  unscale_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, inv_scale, x, bad);
  DL_CUDA_LAUNCH_CHECK();
  unsigned long long host = 0;
  DL_CUDA_CHECK(cudaMemcpy(&host, bad, sizeof host, cudaMemcpyDeviceToHost));  // synchronises
  return static_cast<int64_t>(host);
}

}  // namespace dlaunch::kernels::cuda
