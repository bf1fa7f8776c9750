#include "worker/model/batch_norm.h"

#include <algorithm>

#include "common/error.h"

namespace dlaunch {

namespace cpu = kernels::cpu;

BatchNorm2d::BatchNorm2d(int64_t channels)
    : channels_(channels),
      running_mean_({channels}),
      running_var_({channels}),
      mean_(channels),
      invstd_(channels),
      scale_(channels),
      shift_(channels),
      sum0_(channels),
      sum1_(channels),
      packed_(2 * channels + 1) {
  running_var_.fill(1.0f);
}

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
  if (!training) {
    cpu::batch_norm_eval_scale_shift(channels_, running_mean_.data(), running_var_.data(), gamma_,
                                     beta_, kEps, scale_.data(), shift_.data());
    cpu::batch_norm_apply(s, x, scale_.data(), shift_.data(), residual, relu, y);
    return;
  }
  cpu::batch_norm_sums(s, x, sum0_.data(), sum1_.data());
  count_ = static_cast<double>(s.n * s.hw());
  if (sync) {
    const int64_t c = channels_;
    std::copy(sum0_.begin(), sum0_.end(), packed_.begin());
    std::copy(sum1_.begin(), sum1_.end(), packed_.begin() + c);
    packed_[2 * c] = count_;
    sync->allreduce_sum(packed_.data(), 2 * c + 1);
    for (int64_t i = 0; i < c; ++i) {
      sum0_[i] = packed_[i];
      sum1_[i] = packed_[c + i];
    }
    count_ = packed_[2 * c];
  }
  cpu::batch_norm_scale_shift(channels_, sum0_.data(), sum1_.data(), count_, gamma_, beta_, kEps,
                              kMomentum, mean_.data(), invstd_.data(), scale_.data(),
                              shift_.data(), running_mean_.data(), running_var_.data());
  cpu::batch_norm_apply(s, x, scale_.data(), shift_.data(), residual, relu, y);
}

void BatchNorm2d::backward(const kernels::ActShape& s, const float* x, const float* dy,
                           const float* y, BatchNormSync* sync, float* dx, float* g_out) {
  DL_CHECK(s.c == channels_ && count_ > 0) << "backward without a training forward";
  cpu::batch_norm_backward_reduce(s, x, dy, y, mean_.data(), invstd_.data(), sum0_.data(),
                                  sum1_.data());
  const int64_t c = channels_;
  for (int64_t i = 0; i < c; ++i) {
    dbeta_[i] = static_cast<float>(sum0_[i]);
    dgamma_[i] = static_cast<float>(sum1_[i]);
  }
  if (sync) {
    std::copy(sum0_.begin(), sum0_.end(), packed_.begin());
    std::copy(sum1_.begin(), sum1_.end(), packed_.begin() + c);
    sync->allreduce_sum(packed_.data(), 2 * c);
    for (int64_t i = 0; i < c; ++i) {
      sum0_[i] = packed_[i];
      sum1_[i] = packed_[c + i];
    }
  }
  cpu::batch_norm_backward_apply(s, x, dy, y, mean_.data(), invstd_.data(), gamma_, sum0_.data(),
                                 sum1_.data(), count_, dx, g_out);
}

}  // namespace dlaunch
