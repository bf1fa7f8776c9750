// SGD and Adam with the operation order of the CPU ops (and of torch.optim).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace dlaunch::kernels::cuda {
namespace {

__global__ void sgd_kernel(int64_t n, float* p, const float* grad, float* buf, float lr,
                           float momentum, bool nesterov, float wd, bool first) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float g = grad[i];
    if (wd != 0.f) g = g + wd * p[i];
    if (momentum != 0.f) {
      const float b = first ? g : momentum * buf[i] + g;
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    p[i] = p[i] - lr * g;
  }
}

__global__ void adam_kernel(int64_t n, float* p, const float* grad, float* m, float* v,
                            float step_size, float beta1, float beta2, float eps, float wd,
                            float bc2_sqrt) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float g = grad[i];
    if (wd != 0.f) g = g + wd * p[i];
    m[i] = m[i] * beta1 + (1.f - beta1) * g;
    v[i] = v[i] * beta2 + (1.f - beta2) * g * g;
    const float denom = sqrtf(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] - step_size * m[i] / denom;
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
  const double bc1 = 1.0 - std::pow(double(beta1), double(step));
  const double bc2 = 1.0 - std::pow(double(beta2), double(step));
  adam_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, p, grad, m, v, float(lr / bc1), beta1,
                                                           beta2, eps, weight_decay,
                                                           float(std::sqrt(bc2)));
  DL_CUDA_LAUNCH_CHECK();
}

}  // namespace dlaunch::kernels::cuda
