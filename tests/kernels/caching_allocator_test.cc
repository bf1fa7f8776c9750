// The caching allocator's logic over a counting fake of the device allocator (malloc-backed, with
// an optional byte limit standing in for device memory).
#include "kernels/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <unordered_map>

namespace dlaunch::kernels {
namespace {

struct FakeDevice {
  size_t limit = SIZE_MAX;
  size_t used = 0;
  size_t allocations = 0;
  size_t releases = 0;
  std::unordered_map<void*, size_t> live;

  UnderlyingAllocator allocator() {
    return {[this](size_t bytes) -> void* {
              if (used + bytes > limit) return nullptr;
              void* p = std::malloc(bytes);
              live[p] = bytes;
              used += bytes;
              ++allocations;
              return p;
            },
            [this](void* p) {
              used -= live.at(p);
              live.erase(p);
              std::free(p);
              ++releases;
            }};
  }
};

TEST(CachingAllocator, RoundsToSmallAndLargeGranules) {
  EXPECT_EQ(CachingAllocator::rounded_size(0), 512u);
  EXPECT_EQ(CachingAllocator::rounded_size(1), 512u);
  EXPECT_EQ(CachingAllocator::rounded_size(512), 512u);
  EXPECT_EQ(CachingAllocator::rounded_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::rounded_size((1u << 20) - 1), size_t{1} << 20);
  EXPECT_EQ(CachingAllocator::rounded_size((1u << 20) + 1), (size_t{1} << 20) + (128u << 10));
}

TEST(CachingAllocator, ReusesAFreedBlockOfTheSameSizeClassAndStream) {
  FakeDevice device;
  CachingAllocator cache(device.allocator());
  void* a = cache.allocate(1000, 0);
  cache.free(a);
  void* b = cache.allocate(900, 0);  // same 1024-byte class
  EXPECT_EQ(a, b);
  EXPECT_EQ(device.allocations, 1u);
  const CachingAllocatorStats stats = cache.stats();
  EXPECT_EQ(stats.served_from_cache, 1u);
  EXPECT_EQ(stats.bytes_in_use, 1024u);
  EXPECT_EQ(stats.bytes_cached, 0u);
  cache.free(b);
  EXPECT_EQ(cache.stats().bytes_cached, 1024u);
}

TEST(CachingAllocator, DoesNotReuseABlockOfAnotherSizeClass) {
  FakeDevice device;
  CachingAllocator cache(device.allocator());
  cache.free(cache.allocate(1000, 0));
  void* big = cache.allocate(5000, 0);
  EXPECT_EQ(device.allocations, 2u);
  EXPECT_EQ(cache.stats().served_from_cache, 0u);
  cache.free(big);
}

TEST(CachingAllocator, DoesNotReuseABlockFreedOnAnotherStream) {
  FakeDevice device;
  CachingAllocator cache(device.allocator());
  void* a = cache.allocate(1000, /*stream=*/1);
  cache.free(a);
  void* b = cache.allocate(1000, /*stream=*/2);
  EXPECT_NE(a, b);
  EXPECT_EQ(device.allocations, 2u);
  cache.free(b);
}

TEST(CachingAllocator, SteadyStateStepsMakeNoUnderlyingAllocations) {
  FakeDevice device;
  CachingAllocator cache(device.allocator());
  const size_t step_sizes[] = {4096, 100, 3u << 20, 4096, 77};
  for (int step = 0; step < 5; ++step) {
    std::vector<void*> blocks;
    for (size_t bytes : step_sizes) blocks.push_back(cache.allocate(bytes, 0));
    for (void* block : blocks) cache.free(block);
    if (step == 0) {
      EXPECT_EQ(device.allocations, 5u);
    }
  }
  EXPECT_EQ(device.allocations, 5u);
  EXPECT_EQ(cache.stats().served_from_cache, 20u);
}

TEST(CachingAllocator, ReleasesTheCacheAndRetriesWhenOutOfMemory) {
  FakeDevice device;
  device.limit = 4096;
  CachingAllocator cache(device.allocator());
  cache.free(cache.allocate(3000, 0));    // 3072 bytes cached
  void* other = cache.allocate(2048, 0);  // does not fit beside the cached block
  EXPECT_EQ(device.releases, 1u);
  EXPECT_EQ(cache.stats().bytes_cached, 0u);
  EXPECT_EQ(cache.stats().underlying_releases, 1u);
  EXPECT_EQ(cache.stats().bytes_in_use, 2048u);
  cache.free(other);
}

TEST(CachingAllocator, OutOfMemoryWithNothingCachedSaysWhatToDo) {
  FakeDevice device;
  device.limit = 1024;
  CachingAllocator cache(device.allocator());
  try {
    cache.allocate(4096, 0);
    FAIL() << "expected an out-of-memory error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("could not allocate 4096 bytes"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("--batch_size"), std::string::npos);
  }
}

TEST(CachingAllocator, FreeingAForeignBlockIsAnError) {
  FakeDevice device;
  CachingAllocator cache(device.allocator());
  int not_ours = 0;
  EXPECT_THROW(cache.free(&not_ours), std::logic_error);
}

TEST(CachingAllocator, DestructionReturnsCachedBlocks) {
  FakeDevice device;
  {
    CachingAllocator cache(device.allocator());
    cache.free(cache.allocate(1000, 0));
    cache.free(cache.allocate(1u << 21, 3));
  }
  EXPECT_EQ(device.releases, 2u);
  EXPECT_TRUE(device.live.empty());
}

}  // namespace
}  // namespace dlaunch::kernels
