// The trainer's step sums (train/step_sums.h): the epoch starts from the totals it is given (a
// resumed epoch's), the loss op adds to both triples, clearing the window after its read leaves
// the epoch's sums, the free read of the window exists only where it costs nothing, and a step
// rolled back (rank-level recovery) leaves the sums as they were before it.
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

// What the trainer's log point does: read, sum over the ranks, then clear.
EpochTotals take_window(StepSums& sums) {
  const EpochTotals window = sums.read_window();
  sums.clear_window();
  return window;
}

TEST(StepSums, TheWindowEmptiesWhenReadAndTheEpochKeepsCountingFromItsSeed) {
  StepSums sums(kernels::cpu_backend());
  sums.begin_epoch(EpochTotals{10.0, 7.0, 20.0});
  EXPECT_FALSE(sums.free_window_loss().has_value()) << "no step in the window yet";
  step(sums, 4);
  step(sums, 2);
  const std::optional<double> live = sums.free_window_loss();
  ASSERT_TRUE(live.has_value()) << "the CPU backend's memory is the host's";
  EpochTotals window = take_window(sums);
  EXPECT_EQ(*live, window.mean_loss());
  EXPECT_EQ(window.correct, 6);  // every row hit
  EXPECT_EQ(window.samples, 6);
  EXPECT_GT(window.loss_sum, 0);
  EpochTotals totals = sums.read_totals();
  EXPECT_DOUBLE_EQ(totals.loss_sum, 10.0 + window.loss_sum);
  EXPECT_EQ(totals.correct, 7 + 6);
  EXPECT_EQ(totals.samples, 20 + 6);
  window = take_window(sums);
  EXPECT_EQ(window.loss_sum, 0);
  EXPECT_EQ(window.samples, 0) << "read windows start empty";
  step(sums, 3);
  window = take_window(sums);
  EXPECT_EQ(window.samples, 3);
  totals = sums.read_totals();
  EXPECT_EQ(totals.samples, 29);
  // The next epoch starts from its own seed, and an empty window.
  sums.begin_epoch(EpochTotals{});
  totals = sums.read_totals();
  window = take_window(sums);
  EXPECT_EQ(totals.samples, 0);
  EXPECT_EQ(window.samples, 0);
}

// Reading the window changes nothing until it is cleared (a log point whose all-reduce failed
// keeps its window), and restore() undoes a step's sums.
TEST(StepSums, ReadingChangesNothingAndRestoreUndoesAStep) {
  StepSums sums(kernels::cpu_backend());
  sums.begin_epoch(EpochTotals{1.0, 1.0, 2.0});
  step(sums, 2);
  EXPECT_EQ(sums.read_window().samples, 2);
  EXPECT_EQ(sums.read_window().samples, 2) << "a read alone must not empty the window";
  const StepSums::Saved before = sums.save();
  step(sums, 5);
  EXPECT_EQ(sums.read_totals().samples, 9);
  sums.restore(before);
  EXPECT_EQ(sums.read_window().samples, 2);
  EXPECT_EQ(sums.read_totals().samples, 4);
}

}  // namespace
}  // namespace dlaunch::train
