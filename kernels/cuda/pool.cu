#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace dlaunch::kernels::cuda {
namespace {

// A thread per (image, channel) output (grid-stride).
__global__ void pool_kernel(int64_t n, int64_t c, int64_t hw, int64_t cb, const float* x, float* y) {
  DL_GRID_LOOP(o, n * c) {
    const int64_t img = o / c, ch = o % c;
    const float* base = x + ((img * (c / cb) + ch / cb) * hw) * cb + ch % cb;
    float acc = 0.f;
    for (int64_t p = 0; p < hw; ++p) acc += base[p * cb];
    y[o] = acc / float(hw);
  }
}

__global__ void pool_backward_kernel(int64_t total, int64_t c, int64_t hw, int64_t cb,
                                     const float* dy, float* dx) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t img = i / (c * hw);
    dx[i] = dy[img * c + detail::channel_of(i, c, hw, cb)] / float(hw);
  }
}

}  // namespace

void global_avg_pool_forward(const ActShape& s, const float* x, float* y) {
  DL_CHECK(s.cblock >= 1 && s.c % s.cblock == 0) << "c=" << s.c << " cblock=" << s.cblock;
  pool_kernel<<<detail::blocks_for(s.n * s.c), detail::kThreads>>>(s.n, s.c, s.hw(), s.cblock, x, y);
  DL_CUDA_LAUNCH_CHECK();
}

void global_avg_pool_backward(const ActShape& s, const float* dy, float* dx) {
  DL_CHECK(s.cblock >= 1 && s.c % s.cblock == 0) << "c=" << s.c << " cblock=" << s.cblock;
  pool_backward_kernel<<<detail::blocks_for(s.numel()), detail::kThreads>>>(s.numel(), s.c, s.hw(),
                                                                            s.cblock, dy, dx);
  DL_CUDA_LAUNCH_CHECK();
}

}  // namespace dlaunch::kernels::cuda
