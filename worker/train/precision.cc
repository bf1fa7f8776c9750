#include "worker/train/precision.h"

#include <fmt/format.h>

#include "common/error.h"

namespace dlaunch::train {

MixedPrecision::MixedPrecision(kernels::Dtype dtype, kernels::Backend& backend)
    : dtype_(dtype), backend_(backend) {}

bool MixedPrecision::finish_step(float* grads, size_t n) {
  if (!loss_scaling()) return true;
  const float scale = scaler_.scale();
  const bool found_inf =
      backend_.unscale_count_non_finite(static_cast<int64_t>(n), 1.0f / scale, grads) > 0;
  scaler_.update(found_inf);
  if (found_inf) ++skipped_;
  return !found_inf;
}

nlohmann::json MixedPrecision::state_json() const {
  if (!loss_scaling()) return nullptr;
  return {{"scale", scaler_.state().scale}, {"growth_tracker", scaler_.state().growth_tracker}};
}

void MixedPrecision::load_state_json(const nlohmann::json& state) {
  if (!loss_scaling() || state.is_null()) return;
  if (!state.is_object() || !state.contains("scale") || !state["scale"].is_number() ||
      !state.contains("growth_tracker") || !state["growth_tracker"].is_number_integer()) {
    throw UsageError(fmt::format(
        "the checkpoint's grad_scaler entry must be {{\"scale\": number, \"growth_tracker\": "
        "integer}}, found {}; the checkpoint is damaged: resume from another one",
        state.dump()));
  }
  scaler_.load_state({state["scale"].get<float>(), state["growth_tracker"].get<int64_t>()});
}

std::string MixedPrecision::describe() const {
  const char* name = kernels::dtype_name(dtype_);
  std::string how = dtype_ == kernels::Dtype::kF32
                        ? "fp32 throughout"
                        : fmt::format("{} activations and conv/GEMM inputs, fp32 master weights, BN "
                                      "statistics and loss{}",
                                      name,
                                      loss_scaling() ? fmt::format(", dynamic loss scale from {:g}",
                                                                   scaler_.scale())
                                                     : std::string());
  std::string out = fmt::format("precision {}: {}", name, how);
  if (dtype_ != kernels::Dtype::kF32) {
    // Both backends store fp32 and round (kernels/dtype.h); CUDA also multiplies in the type
    // (op_signatures.inc). Say what that buys and what not.
    out += backend_.host_accessible()
               ? "; emulated on the CPU (fp32 storage, values rounded to " + std::string(name) +
                     " where they are stored) for correctness, not speed: it is slower than fp32"
               : fmt::format("; convolutions and the classifier on tensor cores ({} operands, fp32 "
                             "accumulation), activations stored as fp32 holding {} values",
                             name, name);
  }
  return out;
}

}  // namespace dlaunch::train
