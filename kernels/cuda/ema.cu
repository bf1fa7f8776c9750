// The weights' exponential moving average on CUDA, with the CPU op's element update
// (kernels/ema_update.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/ema_update.h"

namespace dlaunch::kernels::cuda {
namespace {

__global__ void ema_kernel(int64_t n, float decay, const float* x, float* avg) {
  DL_GRID_LOOP(i, n) ema_update_element(avg[i], x[i], decay);
}

}  // namespace

void ema_update(int64_t n, float decay, const float* x, float* avg) {
  ema_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, decay, x, avg);
  DL_CUDA_LAUNCH_CHECK();
}

}  // namespace dlaunch::kernels::cuda
