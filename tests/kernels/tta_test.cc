// Flip test-time augmentation: the logits are the mean of the image's and its mirror image's,
// each computed by a plain eval forward here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "tests/kernels/grad_check.h"
#include "worker/model/resnet.h"
#include "worker/model/tta.h"

namespace dlaunch {
namespace {

using namespace dlaunch::model;

constexpr int64_t kN = 3, kC = 3, kH = 8, kW = 8;

Tensor random_images(uint32_t seed) {
  Tensor t({kN, kC, kH, kW});
  const std::vector<float> v = test::random_vector(static_cast<size_t>(t.numel()), seed);
  t.copy_from_host(v.data());
  return t;
}

TEST(FlipTta, FlipMirrorsEveryRow) {
  const Tensor x = random_images(5);
  const std::vector<float> in = x.to_host(), out = flip_horizontal(x).to_host();
  for (int64_t row = 0; row < kN * kC * kH; ++row)
    for (int64_t w = 0; w < kW; ++w) ASSERT_EQ(out[row * kW + w], in[row * kW + kW - 1 - w]);
}

TEST(FlipTta, LogitsAreTheMeanOfTheImageAndItsMirrorImage) {
  ResNet net(ResNetConfig{18, 4, 3, 5, 8}, 3);
  const Tensor x = random_images(6);
  // A hand-flipped copy, independent of flip_horizontal.
  std::vector<float> mirrored = x.to_host();
  for (int64_t row = 0; row < kN * kC * kH; ++row)
    for (int64_t w = 0; w < kW / 2; ++w) std::swap(mirrored[row * kW + w], mirrored[row * kW + kW - 1 - w]);
  Tensor x_flipped({kN, kC, kH, kW});
  x_flipped.copy_from_host(mirrored.data());

  const std::vector<float> plain = net.forward(x, false).to_host();
  const std::vector<float> flipped = net.forward(x_flipped, false).to_host();
  const std::vector<float> tta = flip_tta_logits(net, x).to_host();
  ASSERT_EQ(tta.size(), plain.size());
  double differs = 0;
  for (size_t i = 0; i < tta.size(); ++i) {
    EXPECT_NEAR(tta[i], 0.5 * (plain[i] + flipped[i]), 1e-5) << i;
    differs = std::max(differs, double(std::fabs(plain[i] - flipped[i])));
  }
  // The network is not mirror-symmetric, so averaging did something.
  EXPECT_GT(differs, 1e-4);
  // The mirror image's TTA logits are the image's.
  const std::vector<float> tta_of_mirror = flip_tta_logits(net, x_flipped).to_host();
  for (size_t i = 0; i < tta.size(); ++i) EXPECT_NEAR(tta_of_mirror[i], tta[i], 1e-5) << i;
}

}  // namespace
}  // namespace dlaunch
