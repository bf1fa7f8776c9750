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
// are in its memory, the double sums and the count included (one packed buffer, the layout
// batch_norm_sync.h gives), so SyncBN reduces that buffer in place and nothing here reads it on
// the host: on a GPU a step queues its kernels and collectives without waiting for them.
#pragma once

#include <cstdint>

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
  // Per-channel state of the last training forward, on the backend. packed_ (2c + 1 doubles) is
  // what SyncBN all-reduces: [sum(c), sumsq(c), count] in the forward, then [sum_dy(c),
  // sum_dy_xhat(c)] in the backward, whose ops read the forward's (global) count still at [2c].
  Tensor mean_, invstd_, scale_, shift_;
  double* packed_ = nullptr;
  bool have_batch_stats_ = false;  // a training forward ran: backward may use its state
};

}  // namespace dlaunch::model
