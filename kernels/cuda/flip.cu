// The left-right flip of flip test-time augmentation on CUDA, with the CPU op's index mapping
// (kernels/flip_index.h), so the images never leave the device.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/flip_index.h"

namespace dlaunch::kernels::cuda {
namespace {

__global__ void flip_kernel(int64_t n, int64_t w, int64_t cblock, const float* x, float* y) {
  DL_GRID_LOOP(i, n) y[i] = x[mirrored_index(i, w, cblock)];
}

}  // namespace

void flip_horizontal(const ActShape& s, const float* x, float* y) {
  DL_CHECK(x != y) << "flip_horizontal: y must not alias x";
  const int64_t n = s.numel();
  flip_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, s.w, s.cblock, x, y);
  DL_CUDA_LAUNCH_CHECK();
}

}  // namespace dlaunch::kernels::cuda
