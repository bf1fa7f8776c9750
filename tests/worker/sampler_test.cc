#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "common/error.h"
#include "worker/data/distributed_sampler.h"

namespace dlaunch::data {
namespace {

std::vector<std::vector<int64_t>> shards(int64_t n, int64_t world, bool shuffle, bool drop_last,
                                         int64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < world; ++r) {
    out.push_back(DistributedSampler(n, world, r, shuffle, 42, drop_last).indices(epoch));
  }
  return out;
}

TEST(DistributedSampler, ShardsAreDisjointAndCompleteWhenDivisible) {
  for (int64_t world : {1, 2, 4, 5}) {
    auto s = shards(100, world, true, false, 3);
    std::multiset<int64_t> all;
    for (auto& shard : s) {
      EXPECT_EQ(shard.size(), static_cast<size_t>(100 / world));
      all.insert(shard.begin(), shard.end());
    }
    EXPECT_EQ(all.size(), 100u);
    EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 100u) << "world " << world;
  }
}

TEST(DistributedSampler, PadsByRepeatingFromTheStart) {
  // 10 samples over 4 ranks: 3 each, total 12, the first 2 of the permutation repeated.
  DistributedSampler s0(10, 4, 0, true, 1, false);
  auto global = s0.global_indices(0);
  ASSERT_EQ(global.size(), 12u);
  EXPECT_EQ(global[10], global[0]);
  EXPECT_EQ(global[11], global[1]);
  std::set<int64_t> covered;
  for (auto& shard : shards(10, 4, true, false, 0)) {
    EXPECT_EQ(shard.size(), 3u);
    covered.insert(shard.begin(), shard.end());
  }
  EXPECT_EQ(covered.size(), 10u);
  // Padding longer than the dataset repeats it several times (PyTorch's rule).
  DistributedSampler tiny(2, 5, 4, false, 0, false);
  EXPECT_EQ(tiny.global_indices(0), (std::vector<int64_t>{0, 1, 0, 1, 0}));
  EXPECT_EQ(tiny.indices(0), (std::vector<int64_t>{0}));
}

TEST(DistributedSampler, DropLastCutsTheTail) {
  // PyTorch: ceil((10 - 4) / 4) = 2 per rank, total 8.
  DistributedSampler s(10, 4, 1, false, 0, true);
  EXPECT_EQ(s.num_samples(), 2);
  EXPECT_EQ(s.indices(0), (std::vector<int64_t>{1, 5}));
  std::set<int64_t> all;
  for (auto& shard : shards(10, 4, true, true, 2)) all.insert(shard.begin(), shard.end());
  EXPECT_EQ(all.size(), 8u);  // disjoint, no padding
}

TEST(DistributedSampler, RankTakesEveryWorldSizeTh) {
  DistributedSampler s(9, 3, 2, false, 0, false);
  EXPECT_EQ(s.indices(5), (std::vector<int64_t>{2, 5, 8}));
}

TEST(DistributedSampler, ShuffleDependsOnSeedPlusEpochOnly) {
  DistributedSampler a(1000, 1, 0, true, 10, false), b(1000, 1, 0, true, 9, false);
  EXPECT_EQ(a.global_indices(3), a.global_indices(3));
  EXPECT_NE(a.global_indices(3), a.global_indices(4));
  // seed + epoch: (10, 3) and (9, 4) give the same order, as in PyTorch.
  EXPECT_EQ(a.global_indices(3), b.global_indices(4));
  // The same global order whatever the world size: what rank r of 2 sees is the even positions.
  auto g = a.global_indices(7);
  DistributedSampler r1(1000, 2, 1, true, 10, false);
  auto mine = r1.indices(7);
  for (size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(mine[i], g[2 * i + 1]);
}

TEST(DistributedSampler, RejectsBadArguments) {
  EXPECT_THROW(DistributedSampler(10, 0, 0, false, 0, false), UsageError);
  EXPECT_THROW(DistributedSampler(10, 2, 2, false, 0, false), UsageError);
  EXPECT_THROW(DistributedSampler(0, 1, 0, false, 0, false), UsageError);
  EXPECT_THROW(DistributedSampler(3, 4, 0, false, 0, true), UsageError);
}

}  // namespace
}  // namespace dlaunch::data
