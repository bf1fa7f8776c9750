// Compute kernels for dtrain, device-neutral: every op takes raw float pointers and a shape
// struct, never a Tensor, so the same signature (kernels/op_signatures.inc) serves the CPU
// implementation declared here
// (namespace dlaunch::kernels::cpu, kernels/cpu/<op>.cc) and the CUDA one
// (namespace dlaunch::kernels::cuda, kernels/cuda/ops_cuda.h, the same math on device
// pointers). Tests check every CPU op by finite differences and every CUDA op against the CPU op.
// Model and trainer code reach the ops through a kernels::Backend (kernels/backend.h), never
// through these namespaces.
//
// Activation layout. Activations are 4-D (N, C, H, W) in one of two layouts, named by
// ActShape::cblock:
//   cblock == 1       plain NCHW;
//   cblock == 8 | 16  oneDNN's nChw8c / nChw16c: channels in blocks of cblock, the block
//                     innermost, i.e. element (n, c, h, w) lives at
//                     (((n * C/cblock + c/cblock) * H + h) * W + w) * cblock + c % cblock.
// Blocked layouts let the oneDNN convolutions run without reordering activations and make the
// per-channel loops (batch norm) one vector per pixel. C must be a multiple of cblock (no
// padding); preferred_cblock() picks the block for a channel count on this CPU.
//
// Conventions: shapes are int64_t; pointers do not alias unless an op says so; every op
// overwrites its outputs (no accumulation) unless it says so. All CPU ops are synchronous and
// run on the calling thread plus the OpenMP team set by set_num_threads(). Bad shapes are bugs
// of the caller and fail DL_CHECK (InternalError); oneDNN failures throw InternalError too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/dtype.h"
#include "kernels/optim_update.h"  // OptimSegment

namespace dlaunch::kernels {

// The augment_batch op's description of a batch (kernels/augment.h, included where the op is
// called or implemented, so that its math stays out of every op's translation unit).
struct AugmentSpec;

struct ActShape {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int cblock = 1;
  int64_t numel() const { return n * c * h * w; }
  int64_t hw() const { return h * w; }
};

// Convolution without bias, square kernel, symmetric padding. Weights are always OIHW
// (c_out, c_in, k, k), the layout of the flat parameter buffer and of PyTorch.
struct ConvShape {
  int64_t n = 0, c_in = 0, h_in = 0, w_in = 0, c_out = 0;
  int64_t kernel = 3, stride = 1, pad = 1;
  int in_cblock = 1, out_cblock = 1;
  int64_t h_out() const { return (h_in + 2 * pad - kernel) / stride + 1; }
  int64_t w_out() const { return (w_in + 2 * pad - kernel) / stride + 1; }
  ActShape in() const { return {n, c_in, h_in, w_in, in_cblock}; }
  ActShape out() const { return {n, c_out, h_out(), w_out(), out_cblock}; }
  int64_t weight_numel() const { return c_out * c_in * kernel * kernel; }
};

// Max pooling, square window, symmetric padding; input and output share the layout `in.cblock`.
struct PoolShape {
  ActShape in;
  int64_t kernel = 3, stride = 2, pad = 1;
  int64_t h_out() const { return (in.h + 2 * pad - kernel) / stride + 1; }
  int64_t w_out() const { return (in.w + 2 * pad - kernel) / stride + 1; }
  ActShape out() const { return {in.n, in.c, h_out(), w_out(), in.cblock}; }
};

// What the convolutions' autotuner did in this process so far (DLAUNCH_CONV_ALGO=autotune): passes
// tuned by trial runs, passes whose choice came from the choice cache (this process's earlier
// choices for another batch size, or the per-host file at cache_path; empty: none), the trial
// runs and the wall seconds spent choosing. All zero on a device that does not autotune.
struct ConvAutotuneStats {
  int64_t tuned = 0, reused = 0, trial_runs = 0;
  double seconds = 0;
  std::string cache_path;
};

namespace cpu {

// ---- threads ---------------------------------------------------------------------------------
// Sets the threads used by the CPU ops (OpenMP team of the calling thread, which is what oneDNN
// uses, and OpenBLAS). Call it from the thread that runs the model. n >= 1.
void set_num_threads(int n);
int num_threads();
// 16 on CPUs with AVX-512, else 8, reduced to 1 when c is not a multiple of it.
int preferred_cblock(int64_t c);

// ---- convolution autotuning --------------------------------------------------------------------
// kernels::ConvAutotuneStats of the CPU convolutions. Thread-safe.
ConvAutotuneStats conv_autotune_stats();

#define DL_OP(ret, name, params, args) ret name params;
#include "kernels/op_signatures.inc"
#undef DL_OP

}  // namespace cpu
}  // namespace dlaunch::kernels
