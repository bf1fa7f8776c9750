#include "worker/model/batch_norm.h"

#include <algorithm>

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
      sums_(static_cast<double*>(backend.alloc(2 * static_cast<size_t>(channels) * sizeof(double)))),
      packed_(2 * channels + 1) {
  running_var_.fill(1.0f);
}

BatchNorm2d::~BatchNorm2d() { backend_.free(sums_); }

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
  const int64_t c = channels_;
  double* sum0 = sums_;
  double* sum1 = sums_ + c;
  be.batch_norm_sums(s, x, sum0, sum1);
  count_ = static_cast<double>(s.n * s.hw());
  if (sync) {
    const size_t sums_bytes = 2 * static_cast<size_t>(c) * sizeof(double);
    be.copy_to_host(packed_.data(), sums_, sums_bytes);
    packed_[2 * c] = count_;
    sync->allreduce_sum(packed_.data(), 2 * c + 1);
    be.copy_from_host(sums_, packed_.data(), sums_bytes);
    count_ = packed_[2 * c];
  }
  be.batch_norm_scale_shift(c, sum0, sum1, count_, gamma_, beta_, kEps, kMomentum, mean_.data(),
                            invstd_.data(), scale_.data(), shift_.data(), running_mean_.data(),
                            running_var_.data());
  be.batch_norm_apply(s, x, scale_.data(), shift_.data(), residual, relu, y);
}

void BatchNorm2d::backward(const kernels::ActShape& s, const float* x, const float* dy,
                           const float* y, BatchNormSync* sync, float* dx, float* g_out) {
  DL_CHECK(s.c == channels_ && count_ > 0) << "backward without a training forward";
  kernels::Backend& be = backend_;
  const int64_t c = channels_;
  double* sum0 = sums_;
  double* sum1 = sums_ + c;
  be.batch_norm_backward_reduce(s, x, dy, y, mean_.data(), invstd_.data(), sum0, sum1);
  be.batch_norm_param_grads(c, sum0, sum1, dgamma_, dbeta_);
  if (sync) {
    const size_t sums_bytes = 2 * static_cast<size_t>(c) * sizeof(double);
    be.copy_to_host(packed_.data(), sums_, sums_bytes);
    sync->allreduce_sum(packed_.data(), 2 * c);
    be.copy_from_host(sums_, packed_.data(), sums_bytes);
  }
  be.batch_norm_backward_apply(s, x, dy, y, mean_.data(), invstd_.data(), gamma_, sum0, sum1,
                               count_, dx, g_out);
}

}  // namespace dlaunch::model
