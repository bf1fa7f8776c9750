#include "worker/data/distributed_sampler.h"

#include <fmt/format.h>

#include <numeric>

#include "common/error.h"
#include "worker/data/random.h"

namespace dlaunch::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t world_size, int64_t rank,
                                       bool shuffle, uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      world_size_(world_size),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw UsageError(fmt::format(
        "distributed sampler: rank {} of world size {} is invalid; expected 0 <= rank < world", rank,
        world_size));
  }
  if (dataset_size < 1) throw UsageError("distributed sampler: the dataset is empty");
  if (drop_last && dataset_size % world_size != 0) {
    // PyTorch: math.ceil((len - num_replicas) / num_replicas).
    num_samples_ = (dataset_size - world_size + world_size - 1) / world_size;
  } else {
    num_samples_ = (dataset_size + world_size - 1) / world_size;
  }
  total_size_ = num_samples_ * world_size_;
  if (num_samples_ < 1) {
    throw UsageError(fmt::format(
        "distributed sampler: {} samples cannot give each of {} ranks a sample with drop_last",
        dataset_size, world_size));
  }
}

std::vector<int64_t> DistributedSampler::global_indices(int64_t epoch) const {
  std::vector<int64_t> idx(dataset_size_);
  std::iota(idx.begin(), idx.end(), 0);
  if (shuffle_) {
    SplitMix rng(hash_combine(seed_ + static_cast<uint64_t>(epoch), 0xD15751ull));
    for (int64_t i = dataset_size_ - 1; i > 0; --i) {
      auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
      std::swap(idx[i], idx[j]);
    }
  }
  if (!drop_last_) {
    // Repeat from the start (several times if the padding exceeds the dataset), as PyTorch.
    size_t original = idx.size();
    for (size_t k = 0; idx.size() < static_cast<size_t>(total_size_); ++k) {
      idx.push_back(idx[k % original]);
    }
  } else {
    idx.resize(total_size_);
  }
  return idx;
}

std::vector<int64_t> DistributedSampler::indices_after(int64_t epoch, int64_t seen) const {
  if (drop_last_ || seen < 0 || seen >= dataset_size_) {
    throw UsageError(fmt::format("distributed sampler: cannot continue an epoch after {} of {} "
                                 "samples{}",
                                 seen, dataset_size_, drop_last_ ? " with drop_last" : ""));
  }
  std::vector<int64_t> all = global_indices(epoch);
  all.resize(dataset_size_);  // the permutation, without this world's padding
  std::vector<int64_t> rest(all.begin() + seen, all.end());
  for (size_t k = 0; rest.size() % static_cast<size_t>(world_size_) != 0; ++k) {
    rest.push_back(all[k % all.size()]);
  }
  std::vector<int64_t> mine;
  mine.reserve(rest.size() / world_size_);
  for (size_t i = static_cast<size_t>(rank_); i < rest.size(); i += static_cast<size_t>(world_size_)) {
    mine.push_back(rest[i]);
  }
  return mine;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> all = global_indices(epoch);
  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  for (int64_t i = rank_; i < total_size_; i += world_size_) mine.push_back(all[i]);
  return mine;
}

}  // namespace dlaunch::data
