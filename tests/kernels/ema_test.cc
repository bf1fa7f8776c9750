// --ema's WeightEma on a small ResNet: it starts from the weights, averages parameters and BN
// running statistics with decay^every every `every` steps (checked against the formula on the
// host), swaps itself into the model for evaluation and back, and round-trips its state.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/error.h"
#include "worker/model/resnet.h"
#include "worker/optim/weight_ema.h"

namespace dlaunch {
namespace {

using model::ResNet;
using model::ResNetConfig;
using optim::WeightEma;

// Every parameter and buffer value of the model, in WeightEma::state()'s order.
std::vector<float> model_state(ResNet& net) {
  std::vector<float> out = net.params_tensor().to_host();
  for (Tensor* b : net.buffers()) {
    const std::vector<float> v = b->to_host();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Moves every parameter and buffer of the model to new values (what a training step would do).
void perturb(ResNet& net, float by) {
  std::vector<float> p = net.params_tensor().to_host();
  for (size_t i = 0; i < p.size(); ++i) p[i] += by * std::sin(0.1f * static_cast<float>(i));
  net.params_tensor().copy_from_host(p.data());
  for (Tensor* b : net.buffers()) {
    std::vector<float> v = b->to_host();
    for (float& x : v) x += by;
    b->copy_from_host(v.data());
  }
}

TEST(Ema, AveragesParametersAndStatisticsEveryKStepsWithDecayToTheK) {
  ResNet net(ResNetConfig{18, 4, 3, 10, 16}, 3);
  WeightEma ema(net, 0.9, 2);
  const std::vector<float> start = model_state(net);
  EXPECT_EQ(ema.state(), start);
  perturb(net, 0.5f);
  const std::vector<float> moved = model_state(net);
  ema.after_step(1);  // not a multiple of 2: nothing
  EXPECT_EQ(ema.state(), start);
  ema.after_step(2);
  const float d = static_cast<float>(std::pow(0.9, 2));
  const std::vector<float> avg = ema.state();
  ASSERT_EQ(avg.size(), start.size());
  for (size_t i = 0; i < avg.size(); ++i)
    ASSERT_EQ(avg[i], d * start[i] + (1.f - d) * moved[i]) << i;
  // The statistics were averaged too (the last elements are buffers).
  EXPECT_NE(avg.back(), start.back());
  EXPECT_NE(avg.back(), moved.back());
}

// --ema_warmup: min(decay, (1 + t) / (10 + t)) at optimizer step t, then ^every.
TEST(Ema, WarmupCapsTheDecayEarlyOn) {
  ResNet net(ResNetConfig{18, 4, 3, 10, 16}, 7);
  WeightEma plain(net, 0.99, 2), warm(net, 0.99, 2, /*warmup=*/true);
  EXPECT_FLOAT_EQ(plain.update_decay(2), 0.99f * 0.99f);
  EXPECT_FLOAT_EQ(warm.update_decay(2), 0.25f * 0.25f);    // (1 + 2) / (10 + 2)
  EXPECT_FLOAT_EQ(warm.update_decay(890), 0.99f * 0.99f);  // 891 / 900 = 0.99
  EXPECT_FLOAT_EQ(warm.update_decay(5000), 0.99f * 0.99f);
  const std::vector<float> start = model_state(net);
  perturb(net, 1.0f);
  const std::vector<float> moved = model_state(net);
  warm.after_step(2);
  const std::vector<float> avg = warm.state();
  for (size_t i = 0; i < avg.size(); ++i)
    ASSERT_EQ(avg[i], 0.0625f * start[i] + 0.9375f * moved[i]) << i;
}

TEST(Ema, AppliedSwapsTheAverageInAndTheWeightsBack) {
  ResNet net(ResNetConfig{18, 4, 3, 10, 16}, 4);
  WeightEma ema(net, 0.5, 1);
  perturb(net, 1.0f);
  ema.after_step(1);
  const std::vector<float> own = model_state(net), avg = ema.state();
  ASSERT_NE(own, avg);
  {
    WeightEma::Applied applied(ema);
    EXPECT_EQ(model_state(net), avg);
  }
  EXPECT_EQ(model_state(net), own);
  EXPECT_EQ(ema.state(), avg);
}

TEST(Ema, StateRoundTripsAndResetTakesTheWeights) {
  ResNet net(ResNetConfig{18, 4, 3, 10, 16}, 5);
  WeightEma ema(net, 0.99, 1);
  perturb(net, 2.0f);
  ema.after_step(1);
  const std::vector<float> saved = ema.state();
  EXPECT_EQ(saved.size(), ema.state_size());
  WeightEma other(net, 0.99, 1);  // starts from the perturbed weights
  EXPECT_NE(other.state(), saved);
  other.load_state(saved);
  EXPECT_EQ(other.state(), saved);
  other.reset_from_model();
  EXPECT_EQ(other.state(), model_state(net));
}

TEST(Ema, RejectsDecayOutsideZeroToOneAndEveryBelowOne) {
  ResNet net(ResNetConfig{18, 4, 3, 10, 16}, 6);
  EXPECT_THROW(WeightEma(net, 1.0, 1), UsageError);
  EXPECT_THROW(WeightEma(net, 0.0, 1), UsageError);
  EXPECT_THROW(WeightEma(net, 0.9, 0), UsageError);
}

}  // namespace
}  // namespace dlaunch
