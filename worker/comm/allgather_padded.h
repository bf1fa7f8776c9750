// ProcessGroup::allgather for byte strings of any size, over an all-gather of equal-sized
// blocks (what gloo and NCCL offer): every rank's size first, then every rank's bytes padded to
// the largest, cut back to each rank's own size. Shared by the gloo and NCCL groups, which
// differ only in how one equal-sized all-gather is done.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace dlaunch::comm {

// `gather_sizes(size)`: every rank's size, indexed by rank. `gather_blocks(block)`: every rank's
// block (all of one size), rank after rank. Both are collective and blocking, as the result is.
template <typename GatherSizes, typename GatherBlocks>
std::vector<std::vector<uint8_t>> allgather_padded(int world, const std::vector<uint8_t>& mine,
                                                   GatherSizes&& gather_sizes,
                                                   GatherBlocks&& gather_blocks) {
  const std::vector<uint64_t> sizes = gather_sizes(static_cast<uint64_t>(mine.size()));
  const uint64_t max_size = std::max<uint64_t>(1, *std::max_element(sizes.begin(), sizes.end()));
  std::vector<uint8_t> block(max_size, 0);
  std::copy(mine.begin(), mine.end(), block.begin());
  const std::vector<uint8_t> all = gather_blocks(block);
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    auto first = all.begin() + static_cast<int64_t>(static_cast<uint64_t>(r) * max_size);
    out[static_cast<size_t>(r)].assign(first,
                                       first + static_cast<int64_t>(sizes[static_cast<size_t>(r)]));
  }
  return out;
}

}  // namespace dlaunch::comm
