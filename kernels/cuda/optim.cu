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

}  // namespace

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
