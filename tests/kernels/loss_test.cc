// Cross-entropy with label smoothing (PyTorch's CrossEntropyLoss(label_smoothing=eps)) against
// the definition written out: the loss against the smoothed target, and its gradient by finite
// differences.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/error.h"
#include "tests/kernels/grad_check.h"
#include "worker/model/loss.h"

namespace dlaunch {
namespace {

using model::softmax_cross_entropy;
using test::expect_gradient;
using test::random_vector;

constexpr int64_t kRows = 4, kClasses = 5;
const std::vector<int32_t> kLabels = {0, 4, 2, 2};

float loss_of(const std::vector<float>& z, float eps, std::vector<float>* grad = nullptr) {
  Tensor logits({kRows, kClasses});
  logits.copy_from_host(z.data());
  Tensor g;
  const float loss = softmax_cross_entropy(logits, kLabels.data(), grad ? &g : nullptr, nullptr, eps);
  if (grad) *grad = g.to_host();
  return loss;
}

// -sum_k q_k log p_k with q = (1 - eps) one_hot + eps / classes, averaged over the rows.
double smoothed_reference(const std::vector<float>& z, double eps) {
  double total = 0;
  for (int64_t i = 0; i < kRows; ++i) {
    double sum_exp = 0;
    for (int64_t k = 0; k < kClasses; ++k) sum_exp += std::exp(double(z[i * kClasses + k]));
    for (int64_t k = 0; k < kClasses; ++k) {
      const double q = (k == kLabels[i] ? 1 - eps : 0) + eps / kClasses;
      total -= q * (double(z[i * kClasses + k]) - std::log(sum_exp));
    }
  }
  return total / kRows;
}

TEST(LabelSmoothing, LossIsCrossEntropyAgainstTheSmoothedTarget) {
  std::vector<float> z = random_vector(kRows * kClasses, 71, -3.f, 3.f);
  for (float eps : {0.0f, 0.1f, 0.2f, 0.9f}) {
    EXPECT_NEAR(loss_of(z, eps), smoothed_reference(z, eps), 1e-5) << "eps " << eps;
  }
  // Smoothing changes the loss (a test that would pass with the term dropped is no test).
  EXPECT_GT(std::fabs(loss_of(z, 0.2f) - loss_of(z, 0.0f)), 1e-2);
}

TEST(LabelSmoothing, GradientMatchesFiniteDifferences) {
  std::vector<float> z = random_vector(kRows * kClasses, 72, -3.f, 3.f);
  const float eps = 0.2f;
  std::vector<float> grad;
  loss_of(z, eps, &grad);
  expect_gradient("smoothed cross entropy", z, grad, [&] { return smoothed_reference(z, eps); },
                  1e-2, 1e-4, 1e-2);
  // Each row's gradient sums to 0, as softmax(z) - q does.
  for (int64_t i = 0; i < kRows; ++i) {
    double row = 0;
    for (int64_t k = 0; k < kClasses; ++k) row += grad[i * kClasses + k];
    EXPECT_NEAR(row, 0.0, 1e-6) << "row " << i;
  }
}

TEST(LabelSmoothing, RejectsEpsilonOutsideZeroToOne) {
  const std::vector<float> z(kRows * kClasses, 0.f);
  EXPECT_THROW(loss_of(z, -0.1f), UsageError);
  EXPECT_THROW(loss_of(z, 1.0f), UsageError);
}


// The training step's form keeps its figures where the step runs: what it adds to each triple
// must be the very bits the trainer got by adding up the returned loss and count on the host
// (`acc[0] += loss * n; acc[1] += correct; acc[2] += n`), and its gradient the same.
TEST(StepSums, AddTheBitsTheHostSumOfTheReturnedLossGives) {
  std::vector<double> expected(6, 0.0), sums(6, 0.0);
  sums[3] = expected[3] = 12.5;  // a resumed epoch's totals: added to, not replaced
  sums[4] = expected[4] = 3;
  sums[5] = expected[5] = 40;
  for (int step = 0; step < 5; ++step) {
    std::vector<float> z = random_vector(kRows * kClasses, 90 + step, -3.f, 3.f);
    Tensor logits({kRows, kClasses});
    logits.copy_from_host(z.data());
    Tensor g_host, g_sums;
    int correct = 0;
    const float loss = softmax_cross_entropy(logits, kLabels.data(), &g_host, &correct, 0.1f);
    for (int j = 0; j < 2; ++j) {
      expected[3 * j] += loss * static_cast<double>(kRows);
      expected[3 * j + 1] += correct;
      expected[3 * j + 2] += static_cast<double>(kRows);
    }
    model::softmax_cross_entropy_sums(logits, kLabels.data(), g_sums, 0.1f, sums.data(), 2);
    EXPECT_EQ(g_sums.to_host(), g_host.to_host()) << "step " << step;
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(sums[i], expected[i]) << "entry " << i;  // bit for bit
  EXPECT_GT(sums[1], 0) << "some rows hit: the count is checked, not only zeros";
}

}  // namespace
}  // namespace dlaunch
