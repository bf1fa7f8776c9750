// One row of softmax cross-entropy with label smoothing, shared by the CPU loop (cpu/loss.cc) and
// the CUDA kernel (cuda/loss.cu), so both devices compute the same loss and gradient and the
// smoothing never needs the logits on the host.
//
// With eps = label_smoothing the target is q = (1 - eps) one_hot(label) + eps / classes
// (PyTorch's CrossEntropyLoss(label_smoothing=eps)). The row's loss -sum_k q_k log p_k is written
// as the plain loss plus eps * (z_label - mean_k z_k), so eps = 0 gives the plain loss bit for bit;
// the gradient is (p - q) / n.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/dtype.h"  // DL_HOST_DEVICE

namespace dlaunch::kernels {

struct CrossEntropyRow {
  double loss;  // this row's loss (not divided by n)
  bool hit;     // the first maximum of the row is the label
};

// grad (the row's `classes` gradients of the mean loss over n rows) may be null. The callers check
// that label is in [0, classes).
DL_HOST_DEVICE CrossEntropyRow cross_entropy_row(int64_t classes, const float* z, int32_t label,
                                                 float eps, double n, float* grad) {
  int64_t arg = 0;
  double sum = z[0];
  for (int64_t j = 1; j < classes; ++j) {
    if (z[j] > z[arg]) arg = j;
    sum += z[j];
  }
  // log-sum-exp around the max keeps exp() in range.
  const double mx = z[arg];
  double e = 0;
  for (int64_t j = 0; j < classes; ++j) e += exp(static_cast<double>(z[j]) - mx);
  const double lse = mx + log(e);
  double loss = lse - z[label];
  if (eps != 0.f) loss += eps * (z[label] - sum / static_cast<double>(classes));
  if (grad) {
    const double off = eps / static_cast<double>(classes);
    for (int64_t j = 0; j < classes; ++j) {
      const double q = (j == label ? 1.0 - eps : 0.0) + off;
      grad[j] = static_cast<float>((exp(static_cast<double>(z[j]) - lse) - q) / n);
    }
  }
  return {loss, arg == label};
}

// A training step's figures added to each of the k triples [loss * n, correct, n] at `sums`:
// `total` is the sum of the n rows' losses in row order and `hits` their hits. The mean loss is
// rounded to float first, as softmax_cross_entropy returns it, so the sums equal what a caller
// adding up that op's results on the host gets, bit for bit.
DL_HOST_DEVICE void add_step_sums(double total, int64_t hits, int64_t n, double* sums, int64_t k) {
  const float mean = static_cast<float>(total / static_cast<double>(n));
  for (int64_t j = 0; j < k; ++j) {
    sums[3 * j] += static_cast<double>(mean) * static_cast<double>(n);
    sums[3 * j + 1] += static_cast<double>(hits);
    sums[3 * j + 2] += static_cast<double>(n);
  }
}

}  // namespace dlaunch::kernels
