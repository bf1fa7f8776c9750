// The mixed-precision helpers on CUDA, with the rounding of kernels/dtype.h compiled for the
// device: a value rounds to the same bf16/fp16 number here as on the CPU (the tests compare the
// two bit for bit on a GPU machine). Also the 16-bit operands of the tensor-core paths
// (low_precision.cuh), encoded with the same header.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace dlaunch::kernels::cuda {
namespace {

// One instantiation per dtype: no per-element branch on it.
template <Dtype D>
__global__ void round_kernel(int64_t n, const float* x, float* y) {
  DL_GRID_LOOP(i, n) y[i] = kernels::round_to_dtype(D, x[i]);
}
template <Dtype D>
__global__ void narrow_kernel(int64_t n, const float* x, uint16_t* y) {
  DL_GRID_LOOP(i, n) y[i] = kernels::dtype_bits(D, x[i]);
}
template <Dtype D>
__global__ void widen_kernel(int64_t n, const uint16_t* x, float* y) {
  DL_GRID_LOOP(i, n) y[i] = kernels::dtype_value(D, x[i]);
}
__global__ void scale_kernel(int64_t n, float alpha, const float* x, float* y) {
  DL_GRID_LOOP(i, n) y[i] = alpha * x[i];
}
__global__ void unscale_kernel(int64_t n, float inv_scale, float* x, unsigned long long* bad) {
  unsigned long long mine = 0;
  DL_GRID_LOOP(i, n) {
    mine += isfinite(x[i]) ? 0 : 1;
    x[i] *= inv_scale;
  }
  if (mine != 0) atomicAdd(bad, mine);
}

}  // namespace

void round_to_dtype(int64_t n, Dtype dtype, const float* x, float* y) {
  if (dtype == Dtype::kBF16) {
    round_kernel<Dtype::kBF16><<<detail::blocks_for(n), detail::kThreads>>>(n, x, y);
  } else if (dtype == Dtype::kF16) {
    round_kernel<Dtype::kF16><<<detail::blocks_for(n), detail::kThreads>>>(n, x, y);
  } else {
    if (x != y) DL_CUDA_CHECK(cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice));
    return;
  }
  DL_CUDA_LAUNCH_CHECK();
}

void scale(int64_t n, float alpha, const float* x, float* y) {
  scale_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, alpha, x, y);
  DL_CUDA_LAUNCH_CHECK();
}

int64_t unscale_count_non_finite(int64_t n, float inv_scale, float* x) {
  auto* bad = static_cast<unsigned long long*>(detail::workspace(sizeof(unsigned long long)));
  DL_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof *bad));
  unscale_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, inv_scale, x, bad);
  DL_CUDA_LAUNCH_CHECK();
  unsigned long long host = 0;
  DL_CUDA_CHECK(cudaMemcpy(&host, bad, sizeof host, cudaMemcpyDeviceToHost));  // synchronises
  return static_cast<int64_t>(host);
}

namespace detail {

cudnnDataType_t cudnn_type(Dtype d) {
  return d == Dtype::kBF16  ? CUDNN_DATA_BFLOAT16
         : d == Dtype::kF16 ? CUDNN_DATA_HALF
                            : CUDNN_DATA_FLOAT;
}

cudaDataType_t cuda_type(Dtype d) {
  return d == Dtype::kBF16 ? CUDA_R_16BF : d == Dtype::kF16 ? CUDA_R_16F : CUDA_R_32F;
}

void* CallOperands::next_slot(int64_t n) {
  DL_CHECK(used_ < 3) << "a tensor-core call takes at most three 16-bit operands";
  const auto slot = static_cast<Scratch>(int(Scratch::kLow0) + used_++);
  return scratch(slot, static_cast<size_t>(n > 0 ? n : 1) * sizeof(uint16_t));
}

const void* CallOperands::in(const float* x, int64_t n) {
  if (dtype_ == Dtype::kF32) return x;
  auto* low = static_cast<uint16_t*>(next_slot(n));
  if (dtype_ == Dtype::kBF16) {
    narrow_kernel<Dtype::kBF16><<<blocks_for(n), kThreads>>>(n, x, low);
  } else {
    narrow_kernel<Dtype::kF16><<<blocks_for(n), kThreads>>>(n, x, low);
  }
  DL_CUDA_LAUNCH_CHECK();
  return low;
}

void* CallOperands::out(float* y, int64_t n, bool reads_y) {
  if (dtype_ == Dtype::kF32) return y;
  DL_CHECK(out_y_ == nullptr) << "a tensor-core call has one output";
  void* low = reads_y ? const_cast<void*>(in(y, n)) : next_slot(n);
  out_y_ = y;
  out_low_ = static_cast<const uint16_t*>(low);
  out_n_ = n;
  return low;
}

void CallOperands::finish() {
  if (out_y_ == nullptr) return;
  if (dtype_ == Dtype::kBF16) {
    widen_kernel<Dtype::kBF16><<<blocks_for(out_n_), kThreads>>>(out_n_, out_low_, out_y_);
  } else {
    widen_kernel<Dtype::kF16><<<blocks_for(out_n_), kThreads>>>(out_n_, out_low_, out_y_);
  }
  DL_CUDA_LAUNCH_CHECK();
  out_y_ = nullptr;
}

}  // namespace detail
}  // namespace dlaunch::kernels::cuda
