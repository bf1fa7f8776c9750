// CUDA implementations of kernels/ops.h: the SAME signatures and math, on device pointers, in
// namespace dlaunch::kernels::cuda (kernels/cuda/<op>.cu; cuDNN convolutions, cuBLAS GEMM, own
// kernels for batch norm, elementwise ops, pooling, loss, optimizers, the flip and the EMA
// update). Built into dlaunch_kernels_cuda only when CMake found a CUDA toolkit
// (DLAUNCH_HAVE_CUDA).
//
// Differences from the CPU ops, all deliberate:
//   - Activations must be NCHW (cblock == 1) for the convolutions (cuDNN has no channel-blocked
//     float layout); the other ops accept any cblock like the CPU ones.
//   - Ops are asynchronous: they are queued on the legacy default stream and return at once;
//     call synchronize() before reading results on the host. softmax_cross_entropy returns a
//     host value and therefore synchronizes; softmax_cross_entropy_sums keeps its figures on
//     the device and does not.
//   - The double per-channel sums of batch norm live in device memory.
//   - With a bf16/fp16 dtype the convolutions and the linear layer multiply 16-bit copies of
//     their operands on tensor cores with fp32 accumulation (low_precision.cuh), where the CPU
//     multiplies in fp32: the same rounded outputs up to the order of accumulation.
// Every CUDA/cuDNN/cuBLAS status is checked; failures throw InternalError naming the call.
// device_count() treats any CUDA error (no driver, no device) as zero devices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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
// Backend::stage_to_device: through pinned host memory with cudaMemcpyAsync, on the legacy
// default stream (no wait for the queued work).
void stage_to_device(void* dst, const void* src, size_t bytes);
// For kernels::Backend (backend_cuda.cc): any bytes, zeroed; a device-to-device copy; a memset.
void* alloc_zeroed(size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);
void zero(void* p, size_t bytes);
// Makes `device` current for the calling thread (cudaSetDevice) and returns its name
// ("NVIDIA H100 80GB HBM3"). Throws InternalError naming the CUDA error.
std::string use_device(int device);
// device_count() with the reason when it is 0: the error cudaGetDeviceCount returned with the
// runtime's words for it ("cudaGetDeviceCount returned cudaErrorNoDevice (no CUDA-capable device
// is detected)"), or "the CUDA runtime reports 0 devices".
int device_count(std::string* why_none);

#define DL_OP(ret, name, params, args) ret name params;
#include "kernels/op_signatures.inc"
#undef DL_OP

}  // namespace dlaunch::kernels::cuda
