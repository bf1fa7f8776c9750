// kernels::Backend: the device dtrain computes on, chosen at run time. One object per device holds
// what the model, optimizer and trainer need from it: memory (alloc/free/zero), copies between
// the host and the device, synchronisation, the activation layout its convolutions prefer, and
// the op table, every op of kernels/op_signatures.inc as a virtual method with the same
// signature and math (the CPU backend forwards to kernels::cpu::, the CUDA one to
// kernels::cuda::). Callers hold a Backend&, never a namespace, so one code path trains on
// either device (the shape of ggml's ggml_backend_i; see docs/architecture.md).
//
// Pointers passed to a backend's ops and copies are its memory (alloc()), except the host side
// of copy_from_host/copy_to_host. The CPU backend's memory is ordinary host memory
// (host_accessible()): callers may read it directly, and the trainer skips staging copies.
//
// Ordering: ops run in the order they are called. The CPU backend runs each op to completion on
// the calling thread (plus its OpenMP team); the CUDA backend queues them on the device and
// returns. copy_to_host and copy_from_host wait for the work queued before them, so values read
// on the host after copy_to_host are final; synchronize() waits for everything queued;
// stage_to_device does not wait. Ops that return a value on the host (softmax_cross_entropy)
// synchronise.
//
// Errors: bad shapes fail DL_CHECK (InternalError); a failed device call throws InternalError
// naming it; alloc() throws SystemError when memory is exhausted. A Backend is used by one
// thread at a time (the training thread); nothing here is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/ops.h"

namespace dlaunch::kernels {

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda:1 (NVIDIA H100 80GB HBM3)": for logs.
  virtual std::string name() const = 0;
  // True when the host can read and write this backend's memory directly.
  virtual bool host_accessible() const = 0;

  // `bytes` of zeroed memory, aligned to 64 bytes or more; free(nullptr) does nothing.
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) noexcept = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  // copy_from_host without waiting for the queued work: the bytes are staged first (in pinned
  // host memory on a GPU) and copied in order with the ops, so `host_src` may change as soon as
  // this returns and `dst` is written after the ops queued before it read it. For the small
  // per-step copies (a batch's sample indices and labels) that would otherwise stall the host
  // once a step.
  virtual void stage_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;

  // The channel block of activations for a layer of c channels (ops.h: ActShape::cblock): 8 or
  // 16 for oneDNN on the CPU, 1 (NCHW) for cuDNN.
  virtual int preferred_cblock(int64_t c) const = 0;
  // What convolution autotuning cost so far (all zero where there is none).
  virtual ConvAutotuneStats conv_autotune_stats() const { return {}; }

#define DL_OP(ret, name, params, args) virtual ret name params = 0;
#include "kernels/op_signatures.inc"
#undef DL_OP
};

// The process's CPU backend (always there).
Backend& cpu_backend();

// Threads of the host-side work: the CPU backend's ops (OpenMP team of the calling thread and
// OpenBLAS) and what else runs on OpenMP (image decoding). n >= 1.
void set_host_threads(int n);
int host_threads();

}  // namespace dlaunch::kernels
