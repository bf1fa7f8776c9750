#include "worker/optim/optimizer.h"

#include <cmath>

#include "common/error.h"

namespace dlaunch::optim {

OptimKind parse_optim_kind(const std::string& text) {
  if (text == "sgd") return OptimKind::kSgd;
  if (text == "adam") return OptimKind::kAdam;
  throw UsageError("--optimizer must be sgd or adam, got '" + text + "'");
}

Optimizer::Optimizer(const OptimConfig& config, kernels::Backend& backend)
    : config_(config), backend_(backend), state_(backend) {
  if (config.momentum < 0 || config.weight_decay < 0)
    throw UsageError("momentum and weight decay must be >= 0, got momentum " +
                     std::to_string(config.momentum) + ", weight decay " +
                     std::to_string(config.weight_decay));
  if (!(config.bn_lr_scale >= 0))
    throw UsageError("the batch norm learning-rate scale must be >= 0, got " +
                     std::to_string(config.bn_lr_scale));
  if (config.kind == OptimKind::kSgd && config.nesterov && config.momentum <= 0)
    throw UsageError("--nesterov needs --momentum > 0 (PyTorch refuses it too)");
  if (config.kind == OptimKind::kAdam &&
      (config.beta1 < 0 || config.beta1 >= 1 || config.beta2 < 0 || config.beta2 >= 1 || config.eps < 0))
    throw UsageError("Adam betas must be in [0, 1) and eps >= 0");
}

void Optimizer::step(float* params, const float* grads, size_t n, float lr,
                     const std::vector<model::ParamInfo>& infos) {
  if (lr < 0) throw UsageError("learning rate must be >= 0, got " + std::to_string(lr));
  const bool sgd = config_.kind == OptimKind::kSgd;
  const size_t state_size = sgd ? (config_.momentum != 0 ? n : 0) : 2 * n;
  const bool first = state_.empty();
  if (first) {
    state_.resize({static_cast<int64_t>(state_size)});
    state_.zero();
  }
  DL_CHECK(static_cast<size_t>(state_.numel()) == state_size)
      << "optimizer state has " << state_.numel() << " floats, expected " << state_size;
  ++step_count_;

  // One kernel call for all parameters when none is treated differently, else one per parameter.
  auto update = [&](size_t begin, size_t count, float wd, float group_lr) {
    if (count == 0) return;
    if (sgd) {
      float* buf = state_.empty() ? nullptr : state_.data() + begin;
      backend_.sgd_step(static_cast<int64_t>(count), params + begin, grads + begin, buf, group_lr,
                             static_cast<float>(config_.momentum), config_.nesterov, wd, first);
    } else {
      backend_.adam_step(static_cast<int64_t>(count), params + begin, grads + begin,
                              state_.data() + begin, state_.data() + n + begin, group_lr,
                              static_cast<float>(config_.beta1), static_cast<float>(config_.beta2),
                              static_cast<float>(config_.eps), wd, step_count_);
    }
  };
  const float wd = static_cast<float>(config_.weight_decay);
  if (infos.empty() || (config_.decay_bn_and_bias && config_.bn_lr_scale == 1.0)) {
    update(0, n, wd, lr);
    return;
  }
  const float bn_lr = static_cast<float>(lr * config_.bn_lr_scale);
  for (const model::ParamInfo& info : infos) {
    DL_CHECK(info.offset + info.count <= n) << info.name << " beyond " << n << " parameters";
    const bool exempt = info.no_weight_decay && !config_.decay_bn_and_bias;
    update(info.offset, info.count, exempt ? 0.0f : wd, info.batch_norm ? bn_lr : lr);
  }
}

void Optimizer::load_state(std::vector<float> state, int64_t step_count) {
  if (step_count < 0) throw UsageError("optimizer step count must be >= 0");
  if (!state_.empty() && state.size() != static_cast<size_t>(state_.numel()))
    throw UsageError("checkpoint optimizer state has " + std::to_string(state.size()) +
                     " floats, this optimizer " + std::to_string(state_.numel()) +
                     ": was it written for another model or optimizer?");
  state_.resize({static_cast<int64_t>(state.size())});
  state_.copy_from_host(state.data());
  step_count_ = step_count;
}

}  // namespace dlaunch::optim
