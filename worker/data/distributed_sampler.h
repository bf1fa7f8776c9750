// Which samples each rank sees in an epoch, with the semantics of PyTorch's
// torch.utils.data.distributed.DistributedSampler:
//   - shuffle: a permutation of [0, n) from a generator seeded with seed + epoch;
//   - without drop_last, the permutation is padded by repeating it from the start until its
//     length is a multiple of world_size (every rank gets ceil(n / world) samples);
//   - with drop_last, the tail is cut instead (floor-ish: ceil((n - world) / world) per rank
//     when n is not a multiple of world);
//   - rank r takes indices[r :: world_size].
// The permutation itself differs from torch.randperm's (we use SplitMix64 + Fisher-Yates; torch's
// generator is not reproducible outside torch), so the same seed gives a different order than
// PyTorch, with the same structure. Pure functions, no state: resuming needs only the epoch.
#pragma once

#include <cstdint>
#include <vector>

namespace dlaunch::data {

class DistributedSampler {
 public:
  // Throws UsageError for world_size < 1, rank outside [0, world_size) or an empty dataset.
  DistributedSampler(int64_t dataset_size, int64_t world_size, int64_t rank, bool shuffle,
                     uint64_t seed, bool drop_last);

  // This rank's samples for `epoch`, in the order they are to be visited.
  std::vector<int64_t> indices(int64_t epoch) const;
  // The whole padded (or cut) list before sharding; rank r's shard is every world_size-th entry.
  std::vector<int64_t> global_indices(int64_t epoch) const;
  // The rest of an epoch of which the first `seen` entries of the permutation were trained (by
  // any world size: after s steps of batch b on W ranks, the ranks together took exactly the
  // first s * b * W entries): permutation[seen, n), padded by repeating the permutation from its
  // start to a multiple of world_size, this rank taking every world_size-th entry. With seen = 0
  // it is indices(epoch); with seen = s * b * world_size it is indices(epoch) without its first
  // s * b entries, padding included. Without drop_last only (UsageError otherwise); 0 <= seen < n.
  std::vector<int64_t> indices_after(int64_t epoch, int64_t seen) const;

  int64_t num_samples() const { return num_samples_; }  // per rank

 private:
  int64_t dataset_size_;
  int64_t world_size_;
  int64_t rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
  int64_t total_size_;
};

}  // namespace dlaunch::data
