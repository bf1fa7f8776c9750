// An epoch's summed figures (train/epoch_totals.h): the means, the checkpoint's array both ways
// (a short or missing one reads as zeros), and the sums over real gloo ranks, with the inf/NaN
// weights riding along in the same all-reduce.
#include "worker/train/epoch_totals.h"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "tests/worker/gloo_ranks.h"

namespace dlaunch::train {
namespace {

TEST(EpochTotals, MeansAndTheCheckpointsArray) {
  const EpochTotals totals{12.0, 30.0, 40.0};
  EXPECT_EQ(totals.mean_loss(), 0.3);
  EXPECT_EQ(totals.accuracy(), 0.75);
  EXPECT_EQ(totals.to_json(), nlohmann::json::array({12.0, 30.0, 40.0}));
  const EpochTotals back = EpochTotals::from_json(totals.to_json());
  EXPECT_EQ(back.loss_sum, 12.0);
  EXPECT_EQ(back.correct, 30.0);
  EXPECT_EQ(back.samples, 40.0);
}

TEST(EpochTotals, AShortOrMissingArrayReadsAsZeros) {
  const EpochTotals shorter = EpochTotals::from_json(nlohmann::json::array({1.5}));
  EXPECT_EQ(shorter.loss_sum, 1.5);
  EXPECT_EQ(shorter.correct, 0);
  EXPECT_EQ(shorter.samples, 0);
  const EpochTotals none = EpochTotals::from_json(nlohmann::json());
  EXPECT_EQ(none.samples, 0);
  const EpochTotals ints = EpochTotals::from_json(nlohmann::json::array({0, 0, 0}));
  EXPECT_EQ(ints.loss_sum, 0);
}

TEST(EpochTotals, SummedOverTheRanksWithTheWeightsAlongside) {
  constexpr int kWorld = 3;
  std::mutex mu;
  std::vector<EpochTotals> sums;
  std::vector<TotalsAndWeights> with_weights;
  test::run_gloo_ranks(kWorld, [&](comm::ProcessGroup& pg) {
    const double r = pg.rank();
    const EpochTotals mine{r + 0.5, 10 * r, 100 + r};
    const EpochTotals sum = sum_over_ranks(pg, mine);
    const TotalsAndWeights both = sum_over_ranks(pg, mine, r == 1 ? 2.0 : 0.0);
    std::lock_guard<std::mutex> lock(mu);
    sums.push_back(sum);
    with_weights.push_back(both);
  });
  ASSERT_EQ(sums.size(), 3u);
  for (int k = 0; k < kWorld; ++k) {
    EXPECT_EQ(sums[k].loss_sum, 0.5 + 1.5 + 2.5);
    EXPECT_EQ(sums[k].correct, 0 + 10 + 20);
    EXPECT_EQ(sums[k].samples, 100 + 101 + 102);
    EXPECT_EQ(with_weights[k].totals.samples, 303);
    EXPECT_EQ(with_weights[k].non_finite_weights, 2.0);
  }
}

}  // namespace
}  // namespace dlaunch::train
