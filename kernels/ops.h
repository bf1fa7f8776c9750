// Compute kernels for dtrain, device-neutral: every op takes raw float pointers and a shape
// struct, never a Tensor, so the same signature serves the CPU implementation declared here
// (namespace dlaunch::kernels::cpu, kernels/cpu/<op>.cc) and the CUDA one
// (namespace dlaunch::kernels::cuda, kernels/cuda/ops_cuda.h, the same math on device
// pointers). Tests check every CPU op by finite differences and every CUDA op against the CPU op.
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

namespace dlaunch::kernels {

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

namespace cpu {

// ---- threads ---------------------------------------------------------------------------------
// Sets the threads used by the CPU ops (OpenMP team of the calling thread, which is what oneDNN
// uses, and OpenBLAS). Call it from the thread that runs the model. n >= 1.
void set_num_threads(int n);
int num_threads();
// 16 on CPUs with AVX-512, else 8, reduced to 1 when c is not a multiple of it.
int preferred_cblock(int64_t c);

// ---- layout ----------------------------------------------------------------------------------
// Copies an activation between layouts (same n, c, h, w). Used at the model's edges and by tests.
void reorder(const ActShape& src_shape, const float* src, int dst_cblock, float* dst);

// ---- convolution (oneDNN; primitives cached per shape) ---------------------------------------
// The implementation of each pass is chosen per shape the first time it runs: autotuned by CPU
// time among oneDNN direct, Winograd and the transposed "twin" (kernels/cpu/conv2d.cc), so the
// first call of a new shape takes a few runs longer. DLAUNCH_CONV_ALGO=direct|auto|twin fixes it
// (bitwise-reproducible results); anything else but "autotune" throws UsageError.
void conv2d_forward(const ConvShape& s, const float* x, const float* w, float* y);
// accumulate: dx += the result instead of dx = the result (a residual block's input gradient is
// the sum of its main path's and its shortcut's; the twin variant does the sum for free).
void conv2d_backward_data(const ConvShape& s, const float* dy, const float* w, float* dx,
                          bool accumulate = false);
void conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw);

// ---- batch norm ------------------------------------------------------------------------------
// Training forward is three steps so SyncBN can all-reduce between them:
//   batch_norm_sums -> (all-reduce sum, sumsq, count) -> batch_norm_scale_shift -> batch_norm_apply.
// Per-channel sum and sum of squares of x over (n, h, w), accumulated in double.
void batch_norm_sums(const ActShape& s, const float* x, double* sum, double* sumsq);
// From the (global) sums: mean, invstd = 1/sqrt(biased var + eps) and the affine
// scale = gamma * invstd, shift = beta - mean * scale. Also updates the running statistics
// like PyTorch (momentum 0.1 means running = 0.9 running + 0.1 batch; running_var uses the
// unbiased variance, count / (count - 1)) when running_mean is not null.
void batch_norm_scale_shift(int64_t c, const double* sum, const double* sumsq, double count,
                            const float* gamma, const float* beta, float eps, float momentum,
                            float* mean, float* invstd, float* scale, float* shift,
                            float* running_mean, float* running_var);
// Eval: scale and shift from the running statistics.
void batch_norm_eval_scale_shift(int64_t c, const float* running_mean, const float* running_var,
                                 const float* gamma, const float* beta, float eps, float* scale,
                                 float* shift);
// y = x * scale[c] + shift[c] (+ residual) (then max(0, .) when relu). The fused BN + add + ReLU
// of a residual block is one pass. residual may be null; y may alias x.
void batch_norm_apply(const ActShape& s, const float* x, const float* scale, const float* shift,
                      const float* residual, bool relu, float* y);
// Backward, two steps around the SyncBN all-reduce of the two sums:
//   g = relu_out ? (relu_out > 0 ? dy : 0) : dy      (relu_out: the fused op's output, or null)
//   sum_dy[c] = sum g,  sum_dy_xhat[c] = sum g * (x - mean) * invstd
// These local sums are also the gradients of beta and gamma.
void batch_norm_backward_reduce(const ActShape& s, const float* x, const float* dy,
                                const float* relu_out, const float* mean, const float* invstd,
                                double* sum_dy, double* sum_dy_xhat);
// dx = gamma * invstd * (g - sum_dy / count - xhat * sum_dy_xhat / count) with the (global)
// sums and count. dx may alias dy. When g_out is not null it also receives g (the gradient
// that reaches an identity shortcut through the fused add + ReLU); g_out must not alias dy.
void batch_norm_backward_apply(const ActShape& s, const float* x, const float* dy,
                               const float* relu_out, const float* mean, const float* invstd,
                               const float* gamma, const double* sum_dy,
                               const double* sum_dy_xhat, double count, float* dx,
                               float* g_out = nullptr);

// ---- elementwise (layout-agnostic: n is the element count) -----------------------------------
void relu_forward(int64_t n, const float* x, float* y);
// dx = y > 0 ? dy : 0 (y is the ReLU output). dx may alias dy.
void relu_backward(int64_t n, const float* y, const float* dy, float* dx);
// Residual add: y = a + b. y may alias a or b.
void add(int64_t n, const float* a, const float* b, float* y);
// Gradient through a residual ReLU into the identity shortcut: acc += y > 0 ? dy : 0.
void add_relu_backward(int64_t n, const float* y, const float* dy, float* acc);

// ---- global average pooling: (N, C, H, W) in layout s -> (N, C) row-major -------------------
void global_avg_pool_forward(const ActShape& s, const float* x, float* y);
void global_avg_pool_backward(const ActShape& s, const float* dy, float* dx);

// ---- linear: y (n, out) = x (n, in) * w^T + b, w is (out, in) like PyTorch (OpenBLAS) --------
void linear_forward(int64_t n, int64_t in, int64_t out, const float* x, const float* w,
                    const float* b, float* y);
// dx may be null (not needed); dw and db are overwritten.
void linear_backward(int64_t n, int64_t in, int64_t out, const float* x, const float* w,
                     const float* dy, float* dx, float* dw, float* db);

// ---- loss ------------------------------------------------------------------------------------
// Mean softmax cross-entropy over n rows of `classes` logits; labels in [0, classes) (checked).
// Writes dlogits = (softmax - onehot) / n when not null, and the number of rows whose argmax
// equals the label to *correct when not null. Returns the mean loss.
float softmax_cross_entropy(int64_t n, int64_t classes, const float* logits,
                            const int32_t* labels, float* dlogits, int64_t* correct);

// ---- optimizers (PyTorch semantics, see worker/optim/optimizer.h) ----------------------------
// torch.optim.SGD for n elements, dampening 0:
//   g = grad + weight_decay * p;  buf = step == 0 ? g : momentum * buf + g   (when momentum != 0)
//   g = nesterov ? g + momentum * buf : buf;  p -= lr * g
// `first` says the momentum buffer is fresh (PyTorch's "buf is None").
void sgd_step(int64_t n, float* p, const float* grad, float* momentum_buf, float lr,
              float momentum, bool nesterov, float weight_decay, bool first);
// torch.optim.Adam (not AdamW, no amsgrad): step is 1-based.
//   g = grad + weight_decay * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
void adam_step(int64_t n, float* p, const float* grad, float* m, float* v, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step);

}  // namespace cpu
}  // namespace dlaunch::kernels
