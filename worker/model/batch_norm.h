// BatchNorm2d / SyncBatchNorm layer over the kernels' batch norm ops, with optional fused
// residual add and ReLU: y = relu?(bn(x) + residual?). Parameters (gamma, beta) and their
// gradients live in the model's flat buffers; the layer only points at them.
//
// With a BatchNormSync the statistics are those of the global batch (all ranks): forward
// all-reduces [sum(C), sumsq(C), count] once, backward all-reduces [sum_dy(C), sum_dy_xhat(C)]
// once, exactly like torch.nn.SyncBatchNorm; dgamma/dbeta stay local (DDP averages them).
// Blocks inside the sync calls; rethrows what they throw.
//
// Everything runs on the layer's backend: x, y, the parameters and every per-channel statistic
// (the double sums included) are in its memory. The SyncBN exchange goes through the host: the
// sums are copied into a host vector, all-reduced and copied back (a device collective on the
// sums in place is the GPU part 2 of the issue).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "worker/model/batch_norm_sync.h"
#include "worker/tensor.h"

namespace dlaunch::model {

class BatchNorm2d {
 public:
  static constexpr float kEps = 1e-5f;
  static constexpr float kMomentum = 0.1f;

  explicit BatchNorm2d(int64_t channels, kernels::Backend& backend = kernels::cpu_backend());
  ~BatchNorm2d();
  BatchNorm2d(const BatchNorm2d&) = delete;
  BatchNorm2d& operator=(const BatchNorm2d&) = delete;

  // gamma/beta and their gradients (channels floats each) in the owner's flat buffers, in the
  // backend's memory.
  void bind(const float* gamma, const float* beta, float* dgamma, float* dbeta);
  int64_t channels() const { return channels_; }

  // training: batch statistics (global with sync), running statistics updated, state kept for
  // backward. eval: running statistics. y may alias x only when neither residual nor backward
  // needs x afterwards.
  void forward(const kernels::ActShape& s, const float* x, const float* residual, bool relu,
               bool training, BatchNormSync* sync, float* y);
  // dy: gradient w.r.t. y; y: the forward output, needed when the layer applied ReLU (else null).
  // Writes dx (may alias dy) and dgamma/dbeta (local sums). g_out, when not null, receives the
  // ReLU-masked dy, i.e. the gradient w.r.t. the fused residual input.
  void backward(const kernels::ActShape& s, const float* x, const float* dy, const float* y,
                BatchNormSync* sync, float* dx, float* g_out = nullptr);

  Tensor& running_mean() { return running_mean_; }
  Tensor& running_var() { return running_var_; }

 private:
  int64_t channels_;
  kernels::Backend& backend_;
  const float* gamma_ = nullptr;
  const float* beta_ = nullptr;
  float* dgamma_ = nullptr;
  float* dbeta_ = nullptr;
  Tensor running_mean_, running_var_;
  // Per-channel state of the last training forward, on the backend; doubles for the sums
  // (sums_ holds sum0 then sum1, c each).
  Tensor mean_, invstd_, scale_, shift_;
  double* sums_ = nullptr;
  std::vector<double> packed_;  // what SyncBN all-reduces, on the host (batch_norm_sync.h)
  double count_ = 0;
};

}  // namespace dlaunch::model
