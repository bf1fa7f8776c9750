#include "worker/model/batch_norm.h"

#include "common/error.h"

namespace dlaunch::model {

BatchNorm2d::BatchNorm2d(int64_t channels, kernels::Backend& backend)
    : channels_(channels),
      backend_(backend),
      running_mean_({channels}, backend),
      running_var_({channels}, backend),
      mean_({channels}, backend),
      invstd_({channels}, backend),
      scale_({channels}, backend),
      shift_({channels}, backend),
      packed_(static_cast<double*>(
          backend.alloc((2 * static_cast<size_t>(channels) + 1) * sizeof(double)))) {
  running_var_.fill(1.0f);
}

BatchNorm2d::~BatchNorm2d() { backend_.free(packed_); }

void BatchNorm2d::bind(const float* gamma, const float* beta, float* dgamma, float* dbeta) {
  gamma_ = gamma;
  beta_ = beta;
  dgamma_ = dgamma;
  dbeta_ = dbeta;
}

void BatchNorm2d::forward(const kernels::ActShape& s, const float* x, const float* residual,
                          bool relu, bool training, BatchNormSync* sync, float* y) {
  DL_CHECK(s.c == channels_) << "batch norm of " << channels_ << " channels got " << s.c;
  DL_CHECK(gamma_ != nullptr) << "batch norm parameters not bound";
  kernels::Backend& be = backend_;
  if (!training) {
    be.batch_norm_eval_scale_shift(channels_, running_mean_.data(), running_var_.data(), gamma_,
                                   beta_, kEps, scale_.data(), shift_.data());
    be.batch_norm_apply(s, x, scale_.data(), shift_.data(), residual, relu, y);
    return;
  }
  // The ops read the count from the device, where they cannot report a bad one; the host knows
  // enough: with SyncBN every other rank adds at least one value per channel.
  DL_CHECK(s.n * s.hw() > 1 || sync != nullptr)
      << "batch norm needs more than one value per channel in training, got " << s.n * s.hw()
      << " (batch " << s.n << ", " << s.h << "x" << s.w << ")";
  const int64_t c = channels_;
  double* sum0 = packed_;
  double* sum1 = packed_ + c;
  double* count = packed_ + 2 * c;
  be.batch_norm_sums(s, x, sum0, sum1, count);
  if (sync) sync->allreduce_sum(packed_, 2 * c + 1);
  be.batch_norm_scale_shift(c, sum0, sum1, count, gamma_, beta_, kEps, kMomentum, mean_.data(),
                            invstd_.data(), scale_.data(), shift_.data(), running_mean_.data(),
                            running_var_.data());
  have_batch_stats_ = true;
  be.batch_norm_apply(s, x, scale_.data(), shift_.data(), residual, relu, y);
}

void BatchNorm2d::backward(const kernels::ActShape& s, const float* x, const float* dy,
                           const float* y, BatchNormSync* sync, float* dx, float* g_out) {
  DL_CHECK(s.c == channels_ && have_batch_stats_) << "backward without a training forward";
  kernels::Backend& be = backend_;
  const int64_t c = channels_;
  double* sum0 = packed_;
  double* sum1 = packed_ + c;
  const double* count = packed_ + 2 * c;  // the forward's, left there by it
  be.batch_norm_backward_reduce(s, x, dy, y, mean_.data(), invstd_.data(), sum0, sum1);
  be.batch_norm_param_grads(c, sum0, sum1, dgamma_, dbeta_);
  if (sync) sync->allreduce_sum(packed_, 2 * c);
  be.batch_norm_backward_apply(s, x, dy, y, mean_.data(), invstd_.data(), gamma_, sum0, sum1,
                               count, dx, g_out);
}

}  // namespace dlaunch::model
