// Linear layer on cuBLAS. cuBLAS is column-major: a row-major (r x c) matrix is its (c x r)
// transpose, so y = x w^T (row-major) is y^T = w x^T, i.e. gemm(T, N) on the same pointers.
// fp32: cublasSgemm. bf16/fp16 (the mixed-precision dtype, op_signatures.inc): cublasGemmEx on
// 16-bit copies of the operands (low_precision.cuh) with an fp32 output and fp32 accumulation
// (CUBLAS_COMPUTE_32F, tensor cores), then the outputs rounded with the emulation's rounding.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"
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

// C (m x n, fp32) = A (op_a) * B (op_b) + beta C, column-major, A and B in `dtype` (as
// CallOperands gives them): Sgemm for fp32, GemmEx with fp32 accumulation otherwise.
void gemm(Dtype dtype, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
          const void* a, int lda, const void* b, int ldb, float beta, float* c, int ldc) {
  const float one = 1.f;
  if (dtype == Dtype::kF32) {
    DL_CUBLAS_CHECK(cublasSgemm(detail::cublas(), op_a, op_b, m, n, k, &one,
                                static_cast<const float*>(a), lda, static_cast<const float*>(b),
                                ldb, &beta, c, ldc));
    return;
  }
  const cudaDataType_t type = detail::cuda_type(dtype);
  DL_CUBLAS_CHECK(cublasGemmEx(detail::cublas(), op_a, op_b, m, n, k, &one, a, type, lda, b, type,
                               ldb, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
}

// The fp32 result of a 16-bit GEMM stored as the dtype would store it.
void store_as(Dtype dtype, int64_t n, float* y) {
  if (dtype != Dtype::kF32) round_to_dtype(n, dtype, y, y);
}

}  // namespace

void linear_forward(int64_t n, int64_t in, int64_t out, const float* x, const float* w,
                    const float* b, float* y, Dtype dtype) {
  DL_CHECK(n > 0 && in > 0 && out > 0) << "n=" << n << " in=" << in << " out=" << out;
  fill_bias_kernel<<<detail::blocks_for(n * out), detail::kThreads>>>(n, out, b, y);
  DL_CUDA_LAUNCH_CHECK();
  detail::CallOperands io(dtype);
  const void* w_in = io.in(w, out * in);
  const void* x_in = io.in(x, n * in);
  gemm(dtype, CUBLAS_OP_T, CUBLAS_OP_N, int(out), int(n), int(in), w_in, int(in), x_in, int(in),
       1.f, y, int(out));
  store_as(dtype, n * out, y);
}

void linear_backward(int64_t n, int64_t in, int64_t out, const float* x, const float* w,
                     const float* dy, float* dx, float* dw, float* db, Dtype dtype) {
  DL_CHECK(n > 0 && in > 0 && out > 0) << "n=" << n << " in=" << in << " out=" << out;
  detail::CallOperands io(dtype);
  const void* x_in = io.in(x, n * in);
  const void* dy_in = io.in(dy, n * out);
  // dw^T (in x out) = x^T (in x n) * dy (n x out)
  gemm(dtype, CUBLAS_OP_N, CUBLAS_OP_T, int(in), int(out), int(n), x_in, int(in), dy_in, int(out),
       0.f, dw, int(in));
  store_as(dtype, out * in, dw);
  if (db) {
    bias_grad_kernel<<<detail::blocks_for(out), detail::kThreads>>>(n, out, dy, db);
    DL_CUDA_LAUNCH_CHECK();
    store_as(dtype, out, db);
  }
  // dx^T (in x n) = w^T (in x out) * dy^T (out x n)
  if (dx) {
    gemm(dtype, CUBLAS_OP_N, CUBLAS_OP_N, int(in), int(n), int(out), io.in(w, out * in), int(in),
         dy_in, int(out), 0.f, dx, int(in));
    store_as(dtype, n * in, dx);
  }
}

}  // namespace dlaunch::kernels::cuda
