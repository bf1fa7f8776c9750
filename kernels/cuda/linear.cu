// Linear layer on cuBLAS. cuBLAS is column-major: a row-major (r x c) matrix is its (c x r)
// transpose, so y = x w^T (row-major) is y^T = w x^T, i.e. gemm(T, N) on the same pointers.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace dlaunch::kernels::cuda {
namespace {

__global__ void fill_bias_kernel(int64_t n, int64_t out, const float* b, float* y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * out;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = b ? b[i % out] : 0.f;
}

// A thread per output feature (grid-stride): db[j] = sum_i dy[i][j].
__global__ void bias_grad_kernel(int64_t n, int64_t out, const float* dy, float* db) {
  DL_GRID_LOOP(j, out) {
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += dy[i * out + j];
    db[j] = float(acc);
  }
}

}  // namespace

void linear_forward(int64_t n, int64_t in, int64_t out, const float* x, const float* w,
                    const float* b, float* y) {
  DL_CHECK(n > 0 && in > 0 && out > 0) << "n=" << n << " in=" << in << " out=" << out;
  fill_bias_kernel<<<detail::blocks_for(n * out), detail::kThreads>>>(n, out, b, y);
  DL_CUDA_LAUNCH_CHECK();
  const float one = 1.f;
  DL_CUBLAS_CHECK(cublasSgemm(detail::cublas(), CUBLAS_OP_T, CUBLAS_OP_N, int(out), int(n), int(in),
                              &one, w, int(in), x, int(in), &one, y, int(out)));
}

void linear_backward(int64_t n, int64_t in, int64_t out, const float* x, const float* w,
                     const float* dy, float* dx, float* dw, float* db) {
  DL_CHECK(n > 0 && in > 0 && out > 0) << "n=" << n << " in=" << in << " out=" << out;
  const float one = 1.f, zero = 0.f;
  // dw^T (in x out) = x^T (in x n) * dy (n x out)
  DL_CUBLAS_CHECK(cublasSgemm(detail::cublas(), CUBLAS_OP_N, CUBLAS_OP_T, int(in), int(out), int(n),
                              &one, x, int(in), dy, int(out), &zero, dw, int(in)));
  if (db) {
    bias_grad_kernel<<<detail::blocks_for(out), detail::kThreads>>>(n, out, dy, db);
    DL_CUDA_LAUNCH_CHECK();
  }
  // dx^T (in x n) = w^T (in x out) * dy^T (out x n)
  if (dx)
    DL_CUBLAS_CHECK(cublasSgemm(detail::cublas(), CUBLAS_OP_N, CUBLAS_OP_N, int(in), int(n),
                                int(out), &one, w, int(in), dy, int(out), &zero, dx, int(in)));
}

}  // namespace dlaunch::kernels::cuda
