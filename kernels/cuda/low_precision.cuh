// The tensor-core paths of the CUDA convolutions and linear layer (op_signatures.inc, "compute
// precision"): with bf16/fp16 their fp32 operands become the 16-bit buffers cuDNN and cuBLAS
// read, in the calling thread's scratch slots (common.cuh), and a 16-bit output is widened back
// into its fp32 tensor. The codes are kernels/dtype.h's (tested on the CPU): narrowing rounds as
// the emulation rounds, so it is exact for the values of the type the model passes, and widening
// is exact. Defined in precision.cu. Everything is queued on the default stream like the ops.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/dtype.h"

namespace dlaunch::kernels::cuda::detail {

// The library's name for a Dtype: CUDNN_DATA_FLOAT / _BFLOAT16 / _HALF; CUDA_R_32F / _16BF / _16F.
cudnnDataType_t cudnn_type(Dtype d);
cudaDataType_t cuda_type(Dtype d);

// The operands of one cuDNN or cuBLAS call in the call's data type. fp32: the pointers
// themselves and no work, so the fp32 paths run exactly as without it. bf16/fp16: each operand
// gets its own scratch slot (at most three per call, common.cuh's kLow0..kLow2), inputs are
// narrowed into it, and finish() widens the output back. Not thread-safe (the slots are the
// calling thread's); a later call's operands reuse the slots, which the stream order makes safe.
class CallOperands {
 public:
  explicit CallOperands(Dtype dtype) : dtype_(dtype) {}
  CallOperands(const CallOperands&) = delete;
  CallOperands& operator=(const CallOperands&) = delete;

  // x (n floats) as the call reads it.
  const void* in(const float* x, int64_t n);
  // Where the call writes y (n floats). reads_y: the call also reads it (beta = 1, an
  // accumulating output), so y's values are narrowed in first. One output per call.
  void* out(float* y, int64_t n, bool reads_y = false);
  // After the library call: widens the output into y (nothing for fp32).
  void finish();

 private:
  void* next_slot(int64_t n);

  Dtype dtype_;
  int used_ = 0;
  float* out_y_ = nullptr;
  const uint16_t* out_low_ = nullptr;
  int64_t out_n_ = 0;
};

}  // namespace dlaunch::kernels::cuda::detail
