#include "worker/model/loss.h"

#include <fmt/format.h>

#include <vector>

#include "common/error.h"

namespace dlaunch::model {
namespace {

// The smoothing term eps * mean_i (z_i,label - mean_k z_i,k), and its gradient
// eps * (one_hot - 1 / classes) / N added to grad_logits when given.
float add_label_smoothing(const Tensor& logits, const int32_t* labels, float eps, Tensor* grad_logits) {
  const int64_t n = logits.dim(0), classes = logits.dim(1);
  const std::vector<float> z = logits.to_host();
  double term = 0;
  for (int64_t i = 0; i < n; ++i) {
    double row_sum = 0;
    for (int64_t k = 0; k < classes; ++k) row_sum += z[i * classes + k];
    term += z[i * classes + labels[i]] - row_sum / static_cast<double>(classes);
  }
  if (grad_logits) {
    const float off = -eps / static_cast<float>(classes * n);
    std::vector<float> delta(static_cast<size_t>(n * classes), off);
    for (int64_t i = 0; i < n; ++i) delta[i * classes + labels[i]] += eps / static_cast<float>(n);
    Tensor d({n, classes}, logits.backend());
    d.copy_from_host(delta.data());
    logits.backend().add(n * classes, grad_logits->data(), d.data(), grad_logits->data());
  }
  return static_cast<float>(eps * term / static_cast<double>(n));
}

}  // namespace

float softmax_cross_entropy(const Tensor& logits, const int32_t* labels, Tensor* grad_logits,
                            int* correct, float label_smoothing) {
  if (!(label_smoothing >= 0.0f && label_smoothing < 1.0f))
    throw UsageError(fmt::format("label smoothing {} is outside [0, 1); expected e.g. 0.1 "
                                 "(0 turns it off)",
                                 label_smoothing));
  DL_CHECK(logits.ndim() == 2) << "logits must be (N, classes), got " << logits.shape_string();
  const int64_t n = logits.dim(0), classes = logits.dim(1);
  kernels::Backend& be = logits.backend();
  if (grad_logits) {
    if (&grad_logits->backend() != &be) *grad_logits = Tensor(be);
    grad_logits->resize({n, classes});
  }
  int64_t hits = 0;
  const float loss = be.softmax_cross_entropy(
      n, classes, logits.data(), labels, grad_logits ? grad_logits->data() : nullptr, &hits);
  if (correct) *correct = static_cast<int>(hits);
  if (label_smoothing == 0.0f) return loss;
  return loss + add_label_smoothing(logits, labels, label_smoothing, grad_logits);
}

}  // namespace dlaunch::model
