#include "worker/model/loss.h"

#include <fmt/format.h>

#include "common/error.h"

namespace dlaunch::model {

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
  const float loss =
      be.softmax_cross_entropy(n, classes, logits.data(), labels,
                               grad_logits ? grad_logits->data() : nullptr, &hits, label_smoothing);
  if (correct) *correct = static_cast<int>(hits);
  return loss;
}

}  // namespace dlaunch::model
