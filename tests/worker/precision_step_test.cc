// What --precision does around a training step (worker/train/precision.h), on the CPU backend:
// fp16 unscales the reduced gradients, skips the step and halves the scale on inf/NaN, and its
// state round-trips through the checkpoint's JSON; fp32 and bf16 leave the gradients alone.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"
#include "kernels/backend.h"
#include "worker/train/precision.h"

namespace dlaunch::train {
namespace {

TEST(PrecisionStep, Fp16UnscalesSkipsOnOverflowAndHalvesTheScale) {
  MixedPrecision mp(kernels::Dtype::kF16, kernels::cpu_backend());
  ASSERT_TRUE(mp.loss_scaling());
  EXPECT_EQ(mp.loss_scale(), 65536.0f);
  std::vector<float> grads = {65536.0f, -131072.0f, 0.0f};
  EXPECT_TRUE(mp.finish_step(grads.data(), grads.size()));  // clean: step
  EXPECT_EQ(grads, (std::vector<float>{1.0f, -2.0f, 0.0f}));  // unscaled by 1/65536
  EXPECT_EQ(mp.loss_scale(), 65536.0f);
  grads = {1.0f, std::numeric_limits<float>::infinity(), 2.0f};
  EXPECT_FALSE(mp.finish_step(grads.data(), grads.size()));  // overflow: skip
  EXPECT_EQ(mp.loss_scale(), 32768.0f);
  grads = {std::nanf(""), 1.0f};
  EXPECT_FALSE(mp.finish_step(grads.data(), grads.size()));
  EXPECT_EQ(mp.loss_scale(), 16384.0f);
  EXPECT_EQ(mp.skipped_steps(), 2);
}

TEST(PrecisionStep, Fp32AndBf16LeaveTheGradientsAlone) {
  for (kernels::Dtype d : {kernels::Dtype::kF32, kernels::Dtype::kBF16}) {
    MixedPrecision mp(d, kernels::cpu_backend());
    EXPECT_FALSE(mp.loss_scaling());
    EXPECT_EQ(mp.loss_scale(), 1.0f);
    std::vector<float> grads = {3.0f, std::numeric_limits<float>::infinity()};
    EXPECT_TRUE(mp.finish_step(grads.data(), grads.size()));  // no scaler: always step
    EXPECT_EQ(grads[0], 3.0f);
    EXPECT_TRUE(mp.state_json().is_null());
  }
}

TEST(PrecisionStep, Fp16StateRoundTripsThroughTheCheckpointJson) {
  MixedPrecision a(kernels::Dtype::kF16, kernels::cpu_backend());
  std::vector<float> grads = {std::numeric_limits<float>::infinity()};
  a.finish_step(grads.data(), grads.size());
  grads = {1.0f};
  a.finish_step(grads.data(), grads.size());
  const nlohmann::json state = a.state_json();
  EXPECT_EQ(state["scale"].get<float>(), 32768.0f);
  EXPECT_EQ(state["growth_tracker"].get<int64_t>(), 1);
  MixedPrecision b(kernels::Dtype::kF16, kernels::cpu_backend());
  b.load_state_json(state);
  EXPECT_EQ(b.loss_scale(), 32768.0f);
  MixedPrecision fresh(kernels::Dtype::kF16, kernels::cpu_backend());
  fresh.load_state_json(nullptr);  // an older checkpoint: the initial scale
  EXPECT_EQ(fresh.loss_scale(), 65536.0f);
  EXPECT_THROW(fresh.load_state_json({{"scale", "big"}}), UsageError);
  EXPECT_THROW(fresh.load_state_json({{"scale", -1.0}, {"growth_tracker", 0}}), UsageError);
}

}  // namespace
}  // namespace dlaunch::train
