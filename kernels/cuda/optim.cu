// SGD and Adam on the GPU: the element updates of optim_update.h, one thread per parameter.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/optim_update.h"

namespace dlaunch::kernels::cuda {
namespace {

__global__ void sgd_kernel(int64_t n, float* p, const float* grad, float* buf, float lr,
                           float momentum, bool nesterov, float wd, bool first) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    sgd_update(p[i], grad[i], buf[i], lr, momentum, nesterov, wd, first);
  }
}

__global__ void adam_kernel(int64_t n, float* p, const float* grad, float* m, float* v,
                            AdamCorrection k, float beta1, float beta2, float eps, float wd) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    adam_update(p[i], grad[i], m[i], v[i], k, beta1, beta2, eps, wd);
  }
}

// The grouped steps: every element finds its segment (a few dozen, binary search, cached) and
// takes that group's lr and weight decay; one launch for all groups.
__global__ void sgd_grouped_kernel(int64_t count, const OptimSegment* segments, int64_t n, float* p,
                                   const float* grad, float* buf, float lr, float momentum,
                                   bool nesterov, bool first) {
  DL_GRID_LOOP(i, n) {
    const OptimSegment& seg = segment_of(segments, count, i);
    sgd_update(p[i], grad[i], buf[i], segment_lr(lr, seg), momentum, nesterov, seg.weight_decay, first);
  }
}

__global__ void adam_grouped_kernel(int64_t count, const OptimSegment* segments, int64_t n, float* p,
                                    const float* grad, float* m, float* v, float lr, double bc1,
                                    float bc2_sqrt, float beta1, float beta2, float eps) {
  DL_GRID_LOOP(i, n) {
    const OptimSegment& seg = segment_of(segments, count, i);
    const AdamCorrection k{adam_step_size(segment_lr(lr, seg), bc1), bc2_sqrt};
    adam_update(p[i], grad[i], m[i], v[i], k, beta1, beta2, eps, seg.weight_decay);
  }
}

}  // namespace

void sgd_step_grouped(int64_t count, const OptimSegment* segments, int64_t n, float* p,
                      const float* grad, float* buf, float lr, float momentum, bool nesterov, bool first) {
  if (n == 0 || count == 0) return;
  sgd_grouped_kernel<<<detail::blocks_for(n), detail::kThreads>>>(count, segments, n, p, grad, buf, lr,
                                                                  momentum, nesterov, first);
  DL_CUDA_LAUNCH_CHECK();
}

void adam_step_grouped(int64_t count, const OptimSegment* segments, int64_t n, float* p,
                       const float* grad, float* m, float* v, float lr, float beta1, float beta2,
                       float eps, int64_t step) {
  if (n == 0 || count == 0) return;
  const AdamCorrection k = adam_correction(lr, beta1, beta2, step);
  adam_grouped_kernel<<<detail::blocks_for(n), detail::kThreads>>>(
      count, segments, n, p, grad, m, v, lr, adam_bc1(beta1, step), k.bc2_sqrt, beta1, beta2, eps);
  DL_CUDA_LAUNCH_CHECK();
}

void sgd_step(int64_t n, float* p, const float* grad, float* buf, float lr, float momentum,
              bool nesterov, float weight_decay, bool first) {
  sgd_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, p, grad, buf, lr, momentum, nesterov,
                                                          weight_decay, first);
  DL_CUDA_LAUNCH_CHECK();
}

void adam_step(int64_t n, float* p, const float* grad, float* m, float* v, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step) {
  adam_kernel<<<detail::blocks_for(n), detail::kThreads>>>(
      n, p, grad, m, v, adam_correction(lr, beta1, beta2, step), beta1, beta2, eps, weight_decay);
  DL_CUDA_LAUNCH_CHECK();
}

}  // namespace dlaunch::kernels::cuda
