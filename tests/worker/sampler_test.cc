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

namespace dlaunch::data {
namespace {

// Issue 14: an epoch interrupted after s steps of batch b on W ranks continues on W' ranks with
// exactly the samples not yet trained: the W ranks took the first s * b * W entries of the
// permutation, and indices_after() shares out the rest.
TEST(DistributedSamplerResume, ContinuesAnEpochOnAnotherWorldWithExactlyTheUnseenSamples) {
  const int64_t n = 103, b = 4, s = 3, epoch = 2;
  std::multiset<int64_t> seen;
  for (int64_t r = 0; r < 2; ++r) {
    auto mine = DistributedSampler(n, 2, r, true, 7, false).indices(epoch);
    seen.insert(mine.begin(), mine.begin() + s * b);
  }
  const int64_t prefix = s * b * 2;
  auto perm = DistributedSampler(n, 1, 0, true, 7, false).global_indices(epoch);
  EXPECT_EQ(seen, std::multiset<int64_t>(perm.begin(), perm.begin() + prefix));
  for (int64_t w2 : {1, 3, 5}) {
    std::multiset<int64_t> rest;
    size_t longest = 0;
    for (int64_t r = 0; r < w2; ++r) {
      auto mine = DistributedSampler(n, w2, r, true, 7, false).indices_after(epoch, prefix);
      longest = std::max(longest, mine.size());
      EXPECT_EQ(mine.size(), static_cast<size_t>((n - prefix + w2 - 1) / w2)) << w2;
      rest.insert(mine.begin(), mine.end());
    }
    // Every unseen sample once, plus the padding (repeats from the permutation's start).
    std::multiset<int64_t> want(perm.begin() + prefix, perm.begin() + n);
    for (int64_t k = 0; static_cast<int64_t>(want.size()) % w2 != 0; ++k) want.insert(perm[k]);
    EXPECT_EQ(rest, want) << w2;
  }
  // The same world: the shard without its first s * b entries, padding included.
  for (int64_t r = 0; r < 2; ++r) {
    DistributedSampler same(n, 2, r, true, 7, false);
    auto full = same.indices(epoch);
    EXPECT_EQ(same.indices_after(epoch, prefix), std::vector<int64_t>(full.begin() + s * b, full.end()));
    EXPECT_EQ(same.indices_after(epoch, 0), full);
  }
  EXPECT_THROW(DistributedSampler(n, 2, 0, true, 7, false).indices_after(epoch, n), UsageError);
  EXPECT_THROW(DistributedSampler(n, 2, 0, true, 7, true).indices_after(epoch, 4), UsageError);
}

}  // namespace
}  // namespace dlaunch::data
