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

// Max pooling: a thread per output element finds its window's first maximum (padding excluded,
// NaN wins: the CPU op's rule). The backward scatters dy to the winners with atomicAdd, since
// overlapping windows (kernel 3, stride 2) can share a winner.
__device__ int64_t window_winner(PoolShape s, const float* plane, int64_t cb, int64_t j,
                                 int64_t oy, int64_t ox) {
  const int64_t y0 = max(oy * s.stride - s.pad, int64_t(0));
  const int64_t x0 = max(ox * s.stride - s.pad, int64_t(0));
  const int64_t y1 = min(oy * s.stride - s.pad + s.kernel, s.in.h);
  const int64_t x1 = min(ox * s.stride - s.pad + s.kernel, s.in.w);
  int64_t best = y0 * s.in.w + x0;
  float best_v = plane[best * cb + j];
  for (int64_t y = y0; y < y1; ++y)
    for (int64_t x = x0; x < x1; ++x) {
      const float v = plane[(y * s.in.w + x) * cb + j];
      if (v > best_v || isnan(v)) {
        best_v = v;
        best = y * s.in.w + x;
        if (isnan(v)) return best;
      }
    }
  return best;
}

// Output element o of a layout-s tensor: its plane (image, channel block), pixel and lane.
// (PoolShape's methods are host code: the output size comes in as ho, wo.)
__global__ void max_pool_kernel(PoolShape s, int64_t ho, int64_t wo, int64_t total, const float* x,
                                float* y, const float* dy, float* dx) {
  const int64_t cb = s.in.cblock, hw_in = s.in.h * s.in.w;
  DL_GRID_LOOP(o, total) {
    const int64_t j = o % cb, pix = (o / cb) % (ho * wo), p = o / (cb * ho * wo);
    const float* px = x + p * hw_in * cb;
    const int64_t win = window_winner(s, px, cb, j, pix / wo, pix % wo);
    if (dy == nullptr) {
      y[o] = px[win * cb + j];
    } else {
      atomicAdd(dx + (p * hw_in + win) * cb + j, dy[o]);
    }
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

void max_pool_forward(const PoolShape& s, const float* x, float* y) {
  const int64_t total = s.out().numel();
  max_pool_kernel<<<detail::blocks_for(total), detail::kThreads>>>(s, s.h_out(), s.w_out(), total, x, y,
                                                                   nullptr, nullptr);
  DL_CUDA_LAUNCH_CHECK();
}

void max_pool_backward(const PoolShape& s, const float* x, const float* dy, float* dx) {
  zero(dx, static_cast<size_t>(s.in.numel()) * sizeof(float));
  const int64_t total = s.out().numel();
  max_pool_kernel<<<detail::blocks_for(total), detail::kThreads>>>(s, s.h_out(), s.w_out(), total, x,
                                                                   nullptr, dy, dx);
  DL_CUDA_LAUNCH_CHECK();
}

}  // namespace dlaunch::kernels::cuda
