// When training counts as diverged (train/divergence.h): an inf/NaN loss sum or any inf/NaN
// weight throws, naming the steps since the last check that passed; fp16's loss is left to its
// loss scaler; a resumed run counts from its checkpoint's step.
#include "worker/train/divergence.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace dlaunch::train {
namespace {

std::string diverged(DivergenceCheck& check, int64_t step, std::optional<double> loss,
                     std::optional<double> weights) {
  try {
    check.check(step, loss, weights);
  } catch (const DivergedError& e) {
    return e.what();
  }
  return "";
}

TEST(DivergenceCheck, FiniteFiguresPassAndMoveTheLastGoodStep) {
  TrainConfig config;
  config.output_dir = "out";
  DivergenceCheck check(config, /*check_loss=*/true, /*global_step=*/100);
  EXPECT_EQ(diverged(check, 110, 3.5, std::nullopt), "");
  EXPECT_EQ(diverged(check, 120, std::nullopt, 0.0), "");
  const std::string msg = diverged(check, 130, std::nan(""), std::nullopt);
  EXPECT_NE(msg.find("the training loss became nan between step 110 and step 130"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("(those in out are from before)"), std::string::npos) << msg;
}

TEST(DivergenceCheck, BadWeightsNameTheLastStepTheWeightsWereCounted) {
  TrainConfig config;
  DivergenceCheck check(config, true, 40);
  EXPECT_EQ(diverged(check, 50, 1.0, std::nullopt), "");
  const std::string msg = diverged(check, 60, 1.0, 2.0);
  EXPECT_NE(msg.find("the weights became inf or NaN between step 40 and step 60"),
            std::string::npos)
      << msg;
}

TEST(DivergenceCheck, WithALossScalerOnlyTheWeightsCount) {
  TrainConfig config;
  DivergenceCheck check(config, /*check_loss=*/false, 0);
  EXPECT_EQ(diverged(check, 10, std::numeric_limits<double>::infinity(), 0.0), "");
  EXPECT_NE(diverged(check, 20, 1.0, 1.0), "");
}

}  // namespace
}  // namespace dlaunch::train
