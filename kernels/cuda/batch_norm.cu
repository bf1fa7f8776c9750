// Batch norm kernels, any channel block. Per-channel reductions: grid (C, slices of the batch),
// each block reduces its images' elements of one channel in double through shared memory and
// adds its partial sums to the outputs with double atomics (outputs are zeroed first).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace dlaunch::kernels::cuda {
namespace {

constexpr int kReduceThreads = 256;

__device__ __forceinline__ int64_t element(int64_t n, int64_t ch, int64_t p, int64_t c,
                                          int64_t hw, int64_t cb) {
  return ((n * (c / cb) + ch / cb) * hw + p) * cb + ch % cb;
}

// Block-wide sum of two doubles; thread 0 adds the totals to out0/out1.
__device__ void block_sum2(double a, double b, double* out0, double* out1) {
  __shared__ double sa[kReduceThreads], sb[kReduceThreads];
  sa[threadIdx.x] = a;
  sb[threadIdx.x] = b;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step >>= 1) {
    if (threadIdx.x < step) {
      sa[threadIdx.x] += sa[threadIdx.x + step];
      sb[threadIdx.x] += sb[threadIdx.x + step];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd(out0, sa[0]);
    atomicAdd(out1, sb[0]);
  }
}

__global__ void sums_kernel(int64_t n, int64_t c, int64_t hw, int64_t cb, const float* x,
                            double* sum, double* sumsq, double* count) {
  const int64_t ch = blockIdx.x;
  // The count goes to device memory with the sums, so SyncBN reduces all three in one buffer.
  if (ch == 0 && blockIdx.y == 0 && threadIdx.x == 0) *count = double(n * hw);
  double a = 0, b = 0;
  for (int64_t img = blockIdx.y; img < n; img += gridDim.y)
    for (int64_t p = threadIdx.x; p < hw; p += blockDim.x) {
      const double v = x[element(img, ch, p, c, hw, cb)];
      a += v;
      b += v * v;
    }
  block_sum2(a, b, sum + ch, sumsq + ch);
}

__global__ void bwd_sums_kernel(int64_t n, int64_t c, int64_t hw, int64_t cb, const float* x,
                                const float* dy, const float* r, const float* mean,
                                const float* invstd, double* sdy, double* sdyx) {
  const int64_t ch = blockIdx.x;
  const float m = mean[ch], is = invstd[ch];
  double a = 0, b = 0;
  for (int64_t img = blockIdx.y; img < n; img += gridDim.y)
    for (int64_t p = threadIdx.x; p < hw; p += blockDim.x) {
      const int64_t i = element(img, ch, p, c, hw, cb);
      float g = dy[i];
      if (r && !(r[i] > 0.f)) g = 0.f;
      a += g;
      b += double(g) * (x[i] - m) * is;
    }
  block_sum2(a, b, sdy + ch, sdyx + ch);
}

__global__ void scale_shift_kernel(int64_t c, const double* sum, const double* sumsq,
                                   const double* count_ptr, const float* gamma, const float* beta,
                                   float eps, float momentum, float* mean, float* invstd,
                                   float* scale, float* shift, float* rm, float* rv) {
  const double count = *count_ptr;
  DL_GRID_LOOP(i, c) {
    const double m = sum[i] / count;
    const double var = fmax(0.0, sumsq[i] / count - m * m);
    const double is = 1.0 / sqrt(var + eps);
    mean[i] = float(m);
    invstd[i] = float(is);
    scale[i] = float(gamma[i] * is);
    shift[i] = float(beta[i] - m * gamma[i] * is);
    if (rm) {
      rm[i] = float((1.0 - momentum) * rm[i] + momentum * m);
      rv[i] = float((1.0 - momentum) * rv[i] + momentum * var * count / (count - 1));
    }
  }
}

__global__ void eval_scale_shift_kernel(int64_t c, const float* rm, const float* rv,
                                        const float* gamma, const float* beta, float eps,
                                        float* scale, float* shift) {
  DL_GRID_LOOP(i, c) {
    const double is = 1.0 / sqrt(double(rv[i]) + eps);
    scale[i] = float(gamma[i] * is);
    shift[i] = float(beta[i] - rm[i] * gamma[i] * is);
  }
}

__global__ void apply_kernel(int64_t total, int64_t c, int64_t hw, int64_t cb, const float* x,
                             const float* scale, const float* shift, const float* res, bool relu,
                             float* y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = detail::channel_of(i, c, hw, cb);
    float v = x[i] * scale[ch] + shift[ch];
    if (res) v += res[i];
    if (relu) v = v > 0.f ? v : 0.f;
    y[i] = v;
  }
}

__global__ void bwd_apply_kernel(int64_t total, int64_t c, int64_t hw, int64_t cb, const float* x,
                                 const float* dy, const float* r, const float* mean,
                                 const float* invstd, const float* gamma, const double* sdy,
                                 const double* sdyx, const double* count_ptr, float* dx,
                                 float* g_out) {
  const double count = *count_ptr;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = detail::channel_of(i, c, hw, cb);
    float g = dy[i];
    if (r && !(r[i] > 0.f)) g = 0.f;
    const float is = invstd[ch];
    const float k0 = gamma[ch] * is;
    const float k1 = float(k0 * sdy[ch] / count);
    const float k2 = float(k0 * is * sdyx[ch] / count);
    const float xi = x[i];
    if (g_out) g_out[i] = g;
    dx[i] = k0 * g - k1 - k2 * (xi - mean[ch]);
  }
}

dim3 reduce_grid(const ActShape& s) {
  const int64_t slices = s.n < 32 ? s.n : 32;
  return dim3(static_cast<unsigned>(s.c), static_cast<unsigned>(slices));
}

void check_shape(const ActShape& s) {
  DL_CHECK(s.n > 0 && s.c > 0 && s.h > 0 && s.w > 0 && s.cblock >= 1 && s.c % s.cblock == 0)
      << "bad activation shape n=" << s.n << " c=" << s.c << " h=" << s.h << " w=" << s.w
      << " cblock=" << s.cblock;
}

__global__ void param_grads_kernel(int64_t c, const double* sdy, const double* sdyx, float* dgamma,
                                   float* dbeta) {
  DL_GRID_LOOP(i, c) {
    dbeta[i] = static_cast<float>(sdy[i]);
    dgamma[i] = static_cast<float>(sdyx[i]);
  }
}

}  // namespace

void batch_norm_sums(const ActShape& s, const float* x, double* sum, double* sumsq,
                     double* count) {
  check_shape(s);
  DL_CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(double) * s.c));
  DL_CUDA_CHECK(cudaMemsetAsync(sumsq, 0, sizeof(double) * s.c));
  sums_kernel<<<reduce_grid(s), kReduceThreads>>>(s.n, s.c, s.hw(), s.cblock, x, sum, sumsq,
                                                  count);
  DL_CUDA_LAUNCH_CHECK();
}

// *count lives on the device: checking it here would synchronise, so the caller checks what it
// knows on the host (worker/model/batch_norm.cc).
void batch_norm_scale_shift(int64_t c, const double* sum, const double* sumsq, const double* count,
                            const float* gamma, const float* beta, float eps, float momentum,
                            float* mean, float* invstd, float* scale, float* shift,
                            float* running_mean, float* running_var) {
  scale_shift_kernel<<<detail::blocks_for(c), detail::kThreads>>>(
      c, sum, sumsq, count, gamma, beta, eps, momentum, mean, invstd, scale, shift, running_mean,
      running_var);
  DL_CUDA_LAUNCH_CHECK();
}

void batch_norm_eval_scale_shift(int64_t c, const float* running_mean, const float* running_var,
                                 const float* gamma, const float* beta, float eps, float* scale,
                                 float* shift) {
  eval_scale_shift_kernel<<<detail::blocks_for(c), detail::kThreads>>>(
      c, running_mean, running_var, gamma, beta, eps, scale, shift);
  DL_CUDA_LAUNCH_CHECK();
}

void batch_norm_apply(const ActShape& s, const float* x, const float* scale, const float* shift,
                      const float* residual, bool relu, float* y) {
  check_shape(s);
  apply_kernel<<<detail::blocks_for(s.numel()), detail::kThreads>>>(
      s.numel(), s.c, s.hw(), s.cblock, x, scale, shift, residual, relu, y);
  DL_CUDA_LAUNCH_CHECK();
}

void batch_norm_backward_reduce(const ActShape& s, const float* x, const float* dy,
                                const float* relu_out, const float* mean, const float* invstd,
                                double* sum_dy, double* sum_dy_xhat) {
  check_shape(s);
  DL_CUDA_CHECK(cudaMemsetAsync(sum_dy, 0, sizeof(double) * s.c));
  DL_CUDA_CHECK(cudaMemsetAsync(sum_dy_xhat, 0, sizeof(double) * s.c));
  bwd_sums_kernel<<<reduce_grid(s), kReduceThreads>>>(s.n, s.c, s.hw(), s.cblock, x, dy, relu_out,
                                                      mean, invstd, sum_dy, sum_dy_xhat);
  DL_CUDA_LAUNCH_CHECK();
}

void batch_norm_backward_apply(const ActShape& s, const float* x, const float* dy,
                               const float* relu_out, const float* mean, const float* invstd,
                               const float* gamma, const double* sum_dy,
                               const double* sum_dy_xhat, const double* count, float* dx,
                               float* g_out) {
  check_shape(s);
  bwd_apply_kernel<<<detail::blocks_for(s.numel()), detail::kThreads>>>(
      s.numel(), s.c, s.hw(), s.cblock, x, dy, relu_out, mean, invstd, gamma, sum_dy, sum_dy_xhat,
      count, dx, g_out);
  DL_CUDA_LAUNCH_CHECK();
}

void batch_norm_param_grads(int64_t c, const double* sum_dy, const double* sum_dy_xhat,
                            float* dgamma, float* dbeta) {
  param_grads_kernel<<<detail::blocks_for(c), detail::kThreads>>>(c, sum_dy, sum_dy_xhat, dgamma,
                                                                  dbeta);
  DL_CUDA_LAUNCH_CHECK();
}

}  // namespace dlaunch::kernels::cuda
