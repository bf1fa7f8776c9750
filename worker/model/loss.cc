#include "worker/model/loss.h"

#include <fmt/format.h>

#include "common/error.h"

namespace dlaunch::model {
namespace {

// The checks and the gradient's shape both loss forms share; returns the logits' backend.
kernels::Backend& prepare(const Tensor& logits, Tensor* grad_logits, float label_smoothing) {
  if (!(label_smoothing >= 0.0f && label_smoothing < 1.0f))
    throw UsageError(fmt::format("label smoothing {} is outside [0, 1); expected e.g. 0.1 "
                                 "(0 turns it off)",
                                 label_smoothing));
  DL_CHECK(logits.ndim() == 2) << "logits must be (N, classes), got " << logits.shape_string();
  kernels::Backend& be = logits.backend();
  if (grad_logits) {
    if (&grad_logits->backend() != &be) *grad_logits = Tensor(be);
    grad_logits->resize({logits.dim(0), logits.dim(1)});
  }
  return be;
}

}  // namespace

float softmax_cross_entropy(const Tensor& logits, const int32_t* labels, Tensor* grad_logits,
                            int* correct, float label_smoothing) {
  kernels::Backend& be = prepare(logits, grad_logits, label_smoothing);
  int64_t hits = 0;
  const float loss = be.softmax_cross_entropy(logits.dim(0), logits.dim(1), logits.data(), labels,
                                              grad_logits ? grad_logits->data() : nullptr, &hits,
                                              label_smoothing);
  if (correct) *correct = static_cast<int>(hits);
  return loss;
}

void softmax_cross_entropy_sums(const Tensor& logits, const int32_t* labels, Tensor& grad_logits,
                                float label_smoothing, double* sums, int64_t k) {
  kernels::Backend& be = prepare(logits, &grad_logits, label_smoothing);
  be.softmax_cross_entropy_sums(logits.dim(0), logits.dim(1), logits.data(), labels,
                                grad_logits.data(), label_smoothing, sums, k);
}

}  // namespace dlaunch::model
