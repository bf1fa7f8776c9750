#include "worker/optim/weight_ema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace dlaunch::optim {

WeightEma::WeightEma(model::ResNet& model, double decay, int64_t every, bool warmup)
    : model_(model), decay_(decay), every_(every), warmup_(warmup), params_(model.backend()) {
  if (!(decay > 0 && decay < 1))
    throw UsageError(fmt::format("EMA decay {} is outside (0, 1); expected e.g. 0.999", decay));
  if (every < 1)
    throw UsageError(
        fmt::format("EMA every {} steps is below 1; expected a step count >= 1", every));
  reset_from_model();
}

void WeightEma::reset_from_model() {
  params_.copy_from(model_.params_tensor());
  buffers_.clear();
  for (Tensor* b : model_.buffers()) {
    buffers_.emplace_back(model_.backend());
    buffers_.back().copy_from(*b);
  }
}

float WeightEma::update_decay(int64_t optimizer_steps) const {
  double d = decay_;
  if (warmup_) {
    const double t = static_cast<double>(optimizer_steps);
    d = std::min(d, (1 + t) / (10 + t));
  }
  return static_cast<float>(std::pow(d, static_cast<double>(every_)));
}

void WeightEma::after_step(int64_t optimizer_steps) {
  if (optimizer_steps % every_ != 0) return;
  const float d = update_decay(optimizer_steps);
  kernels::Backend& be = model_.backend();
  const Tensor& w = model_.params_tensor();
  be.ema_update(w.numel(), d, w.data(), params_.data());
  const std::vector<Tensor*> live = model_.buffers();
  for (size_t i = 0; i < live.size(); ++i) {
    be.ema_update(live[i]->numel(), d, live[i]->data(), buffers_[i].data());
  }
}

std::vector<float> WeightEma::state() const {
  std::vector<float> out = params_.to_host();
  for (const Tensor& b : buffers_) {
    const std::vector<float> v = b.to_host();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

size_t WeightEma::state_size() const {
  size_t n = static_cast<size_t>(params_.numel());
  for (const Tensor& b : buffers_) n += static_cast<size_t>(b.numel());
  return n;
}

void WeightEma::load_state(const std::vector<float>& values) {
  DL_CHECK(values.size() == state_size()) << values.size() << " != " << state_size();
  const float* at = values.data();
  params_.copy_from_host(at);
  at += params_.numel();
  for (Tensor& b : buffers_) {
    b.copy_from_host(at);
    at += b.numel();
  }
}

std::vector<Tensor*> WeightEma::buffers() {
  std::vector<Tensor*> out;
  for (Tensor& b : buffers_) out.push_back(&b);
  return out;
}

// Device-to-device copies both ways (no swap of allocations: the model's layers keep pointers
// into its flat buffer).
WeightEma::Applied::Applied(WeightEma& ema) : ema_(ema), params_(ema.model_.backend()) {
  params_.copy_from(ema_.model_.params_tensor());
  ema_.model_.params_tensor().copy_from(ema_.params_);
  const std::vector<Tensor*> live = ema_.model_.buffers();
  for (size_t i = 0; i < live.size(); ++i) {
    buffers_.emplace_back(ema_.model_.backend());
    buffers_.back().copy_from(*live[i]);
    live[i]->copy_from(ema_.buffers_[i]);
  }
}

WeightEma::Applied::~Applied() {
  ema_.model_.params_tensor().copy_from(params_);
  const std::vector<Tensor*> live = ema_.model_.buffers();
  for (size_t i = 0; i < live.size(); ++i) live[i]->copy_from(buffers_[i]);
}

}  // namespace dlaunch::optim
