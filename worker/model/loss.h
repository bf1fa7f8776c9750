// Softmax cross-entropy for the classifier head.
#pragma once

#include <cstdint>

#include "worker/tensor.h"

namespace dlaunch::model {

// logits: (N, classes). Returns the mean loss over the batch. When grad_logits is not null it is
// resized to logits' shape and receives d(mean loss)/d(logits), i.e. already divided by N.
// When correct is not null it receives the number of rows whose argmax is the label.
// Labels outside [0, classes) throw InternalError (DL_CHECK). Runs on logits' backend:
// labels are host memory on every backend, grad_logits is (re)made in the backend's memory; the
// loss and the count come back to the host (on a GPU this waits for the queued work).
//
// label_smoothing (eps in [0, 1), PyTorch's CrossEntropyLoss(label_smoothing=eps)) trains
// against the target (1 - eps) * one_hot + eps / classes. The backend's loss op computes it with
// the plain loss (kernels/cross_entropy.h), so nothing but the loss and the count crosses to the
// host on a GPU; eps = 0 is the plain loss. Throws UsageError for eps outside [0, 1).
float softmax_cross_entropy(const Tensor& logits, const int32_t* labels, Tensor* grad_logits,
                            int* correct, float label_smoothing = 0.0f);

// The training step's form: the gradient into grad_logits as above, and instead of returning
// the loss and the count, adds [mean loss * n, correct, n] to each of the k triples at `sums`
// (memory of logits' backend), so nothing waits for the device (kernels' op of the same name).
void softmax_cross_entropy_sums(const Tensor& logits, const int32_t* labels, Tensor& grad_logits,
                                float label_smoothing, double* sums, int64_t k);

}  // namespace dlaunch::model
