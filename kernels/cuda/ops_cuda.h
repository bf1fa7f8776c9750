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

void reorder(const ActShape& src_shape, const float* src, int dst_cblock, float* dst);

void conv2d_forward(const ConvShape& s, const float* x, const float* w, float* y);
void conv2d_backward_data(const ConvShape& s, const float* dy, const float* w, float* dx,
                          bool accumulate = false);
void conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw);

void batch_norm_sums(const ActShape& s, const float* x, double* sum, double* sumsq);
void batch_norm_scale_shift(int64_t c, const double* sum, const double* sumsq, double count,
                            const float* gamma, const float* beta, float eps, float momentum,
                            float* mean, float* invstd, float* scale, float* shift,
                            float* running_mean, float* running_var);
void batch_norm_eval_scale_shift(int64_t c, const float* running_mean, const float* running_var,
                                 const float* gamma, const float* beta, float eps, float* scale,
                                 float* shift);
void batch_norm_apply(const ActShape& s, const float* x, const float* scale, const float* shift,
                      const float* residual, bool relu, float* y);
void batch_norm_backward_reduce(const ActShape& s, const float* x, const float* dy,
                                const float* relu_out, const float* mean, const float* invstd,
                                double* sum_dy, double* sum_dy_xhat);
void batch_norm_backward_apply(const ActShape& s, const float* x, const float* dy,
                               const float* relu_out, const float* mean, const float* invstd,
                               const float* gamma, const double* sum_dy,
                               const double* sum_dy_xhat, double count, float* dx,
                               float* g_out = nullptr);

void relu_forward(int64_t n, const float* x, float* y);
void relu_backward(int64_t n, const float* y, const float* dy, float* dx);
void add(int64_t n, const float* a, const float* b, float* y);
void add_relu_backward(int64_t n, const float* y, const float* dy, float* acc);

void global_avg_pool_forward(const ActShape& s, const float* x, float* y);
void global_avg_pool_backward(const ActShape& s, const float* dy, float* dx);

void linear_forward(int64_t n, int64_t in, int64_t out, const float* x, const float* w,
                    const float* b, float* y);
void linear_backward(int64_t n, int64_t in, int64_t out, const float* x, const float* w,
                     const float* dy, float* dx, float* dw, float* db);

// labels and correct are HOST pointers (labels are copied to the device).
float softmax_cross_entropy(int64_t n, int64_t classes, const float* logits,
                            const int32_t* labels, float* dlogits, int64_t* correct);

void sgd_step(int64_t n, float* p, const float* grad, float* momentum_buf, float lr,
              float momentum, bool nesterov, float weight_decay, bool first);
void adam_step(int64_t n, float* p, const float* grad, float* m, float* v, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step);

}  // namespace dlaunch::kernels::cuda
