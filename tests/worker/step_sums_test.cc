// The trainer's step sums (train/step_sums.h): the epoch starts from the totals it is given (a
// resumed epoch's), the loss op adds to both triples, reading the window empties it and leaves
// the epoch's sums, and the free read of the window exists only where it costs nothing.
#include "worker/train/step_sums.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "kernels/backend.h"
#include "worker/model/loss.h"
#include "worker/tensor.h"

namespace dlaunch::train {
namespace {

// One step of `rows` rows of 3 logits, every row's label 0 and logit 0 the largest: all hit.
void step(StepSums& sums, int64_t rows) {
  Tensor logits({rows, 3});
  std::vector<float> z;
  for (int64_t i = 0; i < rows; ++i) z.insert(z.end(), {2.f, 0.f, 0.f});
  logits.copy_from_host(z.data());
  const std::vector<int32_t> labels(static_cast<size_t>(rows), 0);
  Tensor grad;
  model::softmax_cross_entropy_sums(logits, labels.data(), grad, 0.0f, sums.sums(),
                                    StepSums::kTriples);
}

TEST(StepSums, TheWindowEmptiesWhenReadAndTheEpochKeepsCountingFromItsSeed) {
  StepSums sums(kernels::cpu_backend());
  const double resumed[3] = {10.0, 7.0, 20.0};
  sums.begin_epoch(resumed);
  EXPECT_FALSE(sums.free_window_loss().has_value()) << "no step in the window yet";
  step(sums, 4);
  step(sums, 2);
  const std::optional<double> live = sums.free_window_loss();
  ASSERT_TRUE(live.has_value()) << "the CPU backend's memory is the host's";
  double window[3], totals[3];
  sums.take_window(window);
  EXPECT_EQ(*live, window[0] / window[2]);
  EXPECT_EQ(window[1], 6);  // every row hit
  EXPECT_EQ(window[2], 6);
  EXPECT_GT(window[0], 0);
  sums.read_totals(totals);
  EXPECT_DOUBLE_EQ(totals[0], 10.0 + window[0]);
  EXPECT_EQ(totals[1], 7 + 6);
  EXPECT_EQ(totals[2], 20 + 6);
  sums.take_window(window);
  EXPECT_EQ(window[0], 0);
  EXPECT_EQ(window[2], 0) << "read windows start empty";
  step(sums, 3);
  sums.take_window(window);
  EXPECT_EQ(window[2], 3);
  sums.read_totals(totals);
  EXPECT_EQ(totals[2], 29);
  // The next epoch starts from its own seed, and an empty window.
  const double zero[3] = {0, 0, 0};
  sums.begin_epoch(zero);
  sums.read_totals(totals);
  sums.take_window(window);
  EXPECT_EQ(totals[2], 0);
  EXPECT_EQ(window[2], 0);
}

}  // namespace
}  // namespace dlaunch::train
