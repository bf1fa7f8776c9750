#include "worker/optim/optimizer.h"

#include <algorithm>
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

  const float wd = static_cast<float>(config_.weight_decay);
  const bool grouped = !infos.empty() && !(config_.decay_bn_and_bias && config_.bn_lr_scale == 1.0) &&
                       build_segments(n, infos);
  float* buf = sgd && !state_.empty() ? state_.data() : nullptr;
  if (!grouped) {  // one group: every parameter with lr and the weight decay
    if (n == 0) return;
    if (sgd) {
      backend_.sgd_step(static_cast<int64_t>(n), params, grads, buf, lr, static_cast<float>(config_.momentum),
                        config_.nesterov, wd, first);
    } else {
      backend_.adam_step(static_cast<int64_t>(n), params, grads, state_.data(), state_.data() + n, lr,
                         static_cast<float>(config_.beta1), static_cast<float>(config_.beta2),
                         static_cast<float>(config_.eps), wd, step_count_);
    }
    return;
  }
  const auto* segments = static_cast<const kernels::OptimSegment*>(segments_on_backend_.get());
  const auto count = static_cast<int64_t>(segments_.size());
  if (sgd) {
    backend_.sgd_step_grouped(count, segments, static_cast<int64_t>(n), params, grads, buf, lr,
                              static_cast<float>(config_.momentum), config_.nesterov, first);
  } else {
    backend_.adam_step_grouped(count, segments, static_cast<int64_t>(n), params, grads, state_.data(),
                               state_.data() + n, lr, static_cast<float>(config_.beta1),
                               static_cast<float>(config_.beta2), static_cast<float>(config_.eps), step_count_);
  }
}

bool Optimizer::build_segments(size_t n, const std::vector<model::ParamInfo>& infos) {
  const float wd = static_cast<float>(config_.weight_decay);
  // One segment with the plain lr and weight decay: the plain op does the same.
  auto grouped = [&] {
    return !(segments_.size() == 1 && segments_[0].lr_scale == 1.0 && segments_[0].weight_decay == wd);
  };
  if (segments_on_backend_ && segments_n_ == n && segments_infos_ == infos.size()) return grouped();
  std::vector<const model::ParamInfo*> sorted;
  for (const model::ParamInfo& info : infos) sorted.push_back(&info);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  std::vector<kernels::OptimSegment> segments;
  size_t at = 0;
  for (const model::ParamInfo* info : sorted) {
    DL_CHECK(info->offset == at && info->offset + info->count <= n)
        << info->name << " covers [" << info->offset << ", " << info->offset + info->count
        << "); the parameter infos must tile [0, " << n << ") in order, next expected at " << at;
    at += info->count;
    if (info->count == 0) continue;
    const bool exempt = info->no_weight_decay && !config_.decay_bn_and_bias;
    kernels::OptimSegment seg;
    seg.begin = static_cast<int64_t>(info->offset);
    seg.end = static_cast<int64_t>(info->offset + info->count);
    seg.lr_scale = info->batch_norm ? config_.bn_lr_scale : 1.0;
    seg.weight_decay = exempt ? 0.0f : wd;
    if (!segments.empty() && segments.back().end == seg.begin && segments.back().lr_scale == seg.lr_scale &&
        segments.back().weight_decay == seg.weight_decay) {
      segments.back().end = seg.end;
    } else {
      segments.push_back(seg);
    }
  }
  DL_CHECK(at == n) << "the parameter infos cover " << at << " of " << n << " parameters";
  const size_t bytes = segments.size() * sizeof(kernels::OptimSegment);
  segments_on_backend_ = std::unique_ptr<void, BackendFree>(backend_.alloc(std::max<size_t>(bytes, 1)),
                                                            BackendFree{&backend_});
  if (bytes > 0) backend_.copy_from_host(segments_on_backend_.get(), segments.data(), bytes);
  segments_ = std::move(segments);
  segments_n_ = n;
  segments_infos_ = infos.size();
  return grouped();
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
