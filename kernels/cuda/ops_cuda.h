// CUDA implementations of kernels/ops.h: the SAME signatures and math, on device pointers, in
// namespace dlaunch::kernels::cuda (kernels/cuda/<op>.cu; cuDNN convolutions, cuBLAS GEMM, own
// kernels for batch norm, elementwise ops, pooling, loss and optimizers). Built into
// dlaunch_kernels_cuda only when CMake found a CUDA toolkit (DLAUNCH_HAVE_CUDA).
//
// Differences from the CPU ops, all deliberate:
//   - Activations must be NCHW (cblock == 1) for the convolutions (cuDNN has no channel-blocked
//     float layout); the other ops accept any cblock like the CPU ones.
//   - Ops are asynchronous: they are queued on the legacy default stream and return at once;
//     call synchronize() before reading results on the host. softmax_cross_entropy returns a
//     host value and therefore synchronizes.
//   - The double per-channel sums of batch norm live in device memory.
// Every CUDA/cuDNN/cuBLAS status is checked; failures throw InternalError naming the call.
// device_count() treats any CUDA error (no driver, no device) as zero devices.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace dlaunch::kernels::cuda {

int device_count();
void synchronize();
// Device memory helpers for tests and the trainer's future CUDA path.
float* alloc_floats(int64_t n);
double* alloc_doubles(int64_t n);
void free_device(void* p);
void copy_to_device(void* dst, const void* src, int64_t bytes);
void copy_to_host(void* dst, const void* src, int64_t bytes);

#include "kernels/op_signatures.inc"

}  // namespace dlaunch::kernels::cuda
