// The CPU ops of the fast recipe (issue 11) against hand computations: the loss op's label
// smoothing, the horizontal flip of test-time augmentation and the EMA update of the weights.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/ops.h"

namespace dlaunch {
namespace {

namespace cpu = kernels::cpu;

// Two rows of three classes, eps 0.3: q = 0.7 one_hot + 0.1, loss = mean of -sum q log softmax,
// gradient (softmax - q) / 2, every number written out here rather than taken from the header.
TEST(LossOp, LabelSmoothingMatchesHandComputation) {
  const std::vector<float> z = {1.f, 2.f, 3.f, 0.5f, -1.f, 0.f};
  const std::vector<int32_t> labels = {0, 2};
  const float eps = 0.3f;
  std::vector<float> grad(6);
  int64_t correct = -1;
  const float loss =
      cpu::softmax_cross_entropy(2, 3, z.data(), labels.data(), grad.data(), &correct, eps);
  double want_loss = 0;
  for (int i = 0; i < 2; ++i) {
    const double e0 = std::exp(double(z[i * 3])), e1 = std::exp(double(z[i * 3 + 1])),
                 e2 = std::exp(double(z[i * 3 + 2]));
    const double p[3] = {e0 / (e0 + e1 + e2), e1 / (e0 + e1 + e2), e2 / (e0 + e1 + e2)};
    for (int k = 0; k < 3; ++k) {
      const double q = (k == labels[i] ? 0.7 : 0.0) + 0.1;
      want_loss -= q * std::log(p[k]) / 2;
      EXPECT_NEAR(grad[i * 3 + k], (p[k] - q) / 2, 1e-7) << "row " << i << " class " << k;
    }
  }
  EXPECT_NEAR(loss, want_loss, 1e-6);
  EXPECT_EQ(correct, 0);  // row 0's maximum is class 2, row 1's class 0
  // eps = 0 is the plain op, bit for bit (the default argument).
  std::vector<float> plain_grad(6), zero_grad(6);
  const float plain =
      cpu::softmax_cross_entropy(2, 3, z.data(), labels.data(), plain_grad.data(), nullptr);
  const float zero =
      cpu::softmax_cross_entropy(2, 3, z.data(), labels.data(), zero_grad.data(), nullptr, 0.f);
  EXPECT_EQ(plain, zero);
  EXPECT_EQ(plain_grad, zero_grad);
  EXPECT_GT(std::fabs(loss - plain), 1e-2);  // the smoothing did something
}

// Every layout: element (n, c, h, w) of the output is element (n, c, h, W - 1 - w) of the input,
// located by the layout formula of ops.h written out here.
TEST(TtaFlipOp, MirrorsEveryRowInEveryLayout) {
  for (const kernels::ActShape s :
       {kernels::ActShape{2, 3, 4, 5, 1}, kernels::ActShape{2, 16, 3, 7, 8},
        kernels::ActShape{1, 32, 2, 3, 16}}) {
    std::vector<float> x(static_cast<size_t>(s.numel())), y(x.size(), -1.f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
    cpu::flip_horizontal(s, x.data(), y.data());
    auto at = [&](int64_t n, int64_t c, int64_t h, int64_t w) {
      return (((n * (s.c / s.cblock) + c / s.cblock) * s.h + h) * s.w + w) * s.cblock +
             c % s.cblock;
    };
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t c = 0; c < s.c; ++c)
        for (int64_t h = 0; h < s.h; ++h)
          for (int64_t w = 0; w < s.w; ++w)
            ASSERT_EQ(y[at(n, c, h, w)], x[at(n, c, h, s.w - 1 - w)])
                << "cblock " << s.cblock << " at " << n << "," << c << "," << h << "," << w;
  }
}

// avg = decay * avg + (1 - decay) * x, element by element, written out with the values.
TEST(EmaUpdateOp, AveragesLikeTheHandComputation) {
  const std::vector<float> x = {1.f, -2.f, 10.f, 0.f};
  std::vector<float> avg = {0.f, 2.f, 10.f, -4.f};
  cpu::ema_update(4, 0.75f, x.data(), avg.data());
  EXPECT_EQ(avg, (std::vector<float>{0.25f, 1.f, 10.f, -3.f}));
  cpu::ema_update(4, 0.5f, x.data(), avg.data());
  EXPECT_EQ(avg, (std::vector<float>{0.625f, -0.5f, 10.f, -1.5f}));
}

}  // namespace
}  // namespace dlaunch
