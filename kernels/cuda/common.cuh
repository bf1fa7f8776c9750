// Shared helpers of the CUDA kernels: status checks that throw InternalError, launch geometry,
// per-thread library handles and a grow-only device workspace.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>

#include "common/error.h"

#define DL_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    cudaError_t e_ = (expr);                                                                  \
    DL_CHECK(e_ == cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);                   \
  } while (0)
#define DL_CUDNN_CHECK(expr)                                                                  \
  do {                                                                                        \
    cudnnStatus_t e_ = (expr);                                                                \
    DL_CHECK(e_ == CUDNN_STATUS_SUCCESS) << #expr << ": " << cudnnGetErrorString(e_);         \
  } while (0)
#define DL_CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                        \
    cublasStatus_t e_ = (expr);                                                               \
    DL_CHECK(e_ == CUBLAS_STATUS_SUCCESS) << #expr << ": cuBLAS status " << int(e_);          \
  } while (0)
// for (i = this thread's first item; i < n; i += all threads of the grid)
#define DL_GRID_LOOP(i, n)                                                  \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)
// After a kernel launch: reports bad launch configurations at once.
#define DL_CUDA_LAUNCH_CHECK() DL_CUDA_CHECK(cudaGetLastError())

namespace dlaunch::kernels::cuda::detail {

// Launch geometry: kThreads per block and at most 65535 * 4 blocks, so EVERY kernel launched with
// blocks_for() must cover its items with a grid-stride loop (DL_GRID_LOOP), never one thread per
// item: past 262,140 * 256 = 67M items the grid stops growing.
constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 4 ? (b < 1 ? 1 : b) : 65535 * 4);
}

cudnnHandle_t cudnn();
cublasHandle_t cublas();
// Device buffers owned by the calling thread, grow-only: scratch(slot, bytes) is at least `bytes`
// and valid until the next call for the same slot. Growing one synchronises the device first
// (queued work may still use the old buffer). An op that needs several buffers at once takes
// distinct slots: the library workspace, and the 16-bit copies of the tensor-core paths
// (low_precision.cuh).
enum class Scratch : int { kWorkspace, kLow0, kLow1, kLow2, kCount };
void* scratch(Scratch slot, size_t bytes);
// The cuDNN/cuBLAS workspace.
inline void* workspace(size_t bytes) { return scratch(Scratch::kWorkspace, bytes); }

// Channel of flat element i in an (N, C, H, W) activation with channel block cb.
__device__ __forceinline__ int64_t channel_of(int64_t i, int64_t c, int64_t hw, int64_t cb) {
  return ((i / (hw * cb)) % (c / cb)) * cb + i % cb;
}

}  // namespace dlaunch::kernels::cuda::detail
