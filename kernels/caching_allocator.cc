#include "kernels/caching_allocator.h"

#include <stdexcept>
#include <string>

namespace dlaunch::kernels {

namespace {
constexpr size_t kSmallGranule = 512;
constexpr size_t kLargeThreshold = size_t{1} << 20;
constexpr size_t kLargeGranule = size_t{128} << 10;

size_t round_up(size_t bytes, size_t granule) {
  return (bytes + granule - 1) / granule * granule;
}
}  // namespace

size_t CachingAllocator::rounded_size(size_t bytes) {
  if (bytes == 0) return kSmallGranule;  // a distinct, valid block for empty tensors
  return bytes < kLargeThreshold ? round_up(bytes, kSmallGranule) : round_up(bytes, kLargeGranule);
}

CachingAllocator::CachingAllocator(UnderlyingAllocator underlying)
    : underlying_(std::move(underlying)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

void* CachingAllocator::allocate(size_t bytes, StreamId stream) {
  const size_t size = rounded_size(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  void* block = nullptr;
  auto cached = cached_.find({stream, size});
  if (cached != cached_.end() && !cached->second.empty()) {
    block = cached->second.back();
    cached->second.pop_back();
    stats_.bytes_cached -= size;
    ++stats_.served_from_cache;
  } else {
    block = allocate_underlying(size);
  }
  in_use_.emplace(block, BlockInfo{size, stream});
  stats_.bytes_in_use += size;
  return block;
}

void* CachingAllocator::allocate_underlying(size_t size) {
  void* block = underlying_.allocate(size);
  if (block == nullptr && stats_.bytes_cached > 0) {
    // Out of memory while holding free blocks of other sizes or streams: give them back, retry.
    release_cached_locked();
    block = underlying_.allocate(size);
  }
  if (block == nullptr) {
    throw std::runtime_error(
        "device out of memory: could not allocate " + std::to_string(size) + " bytes with " +
        std::to_string(stats_.bytes_in_use) +
        " bytes in use and the cache emptied; use a smaller --batch_size or model width");
  }
  ++stats_.underlying_allocations;
  return block;
}

void CachingAllocator::free(void* block) {
  if (block == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = in_use_.find(block);
  if (it == in_use_.end()) {
    throw std::logic_error(
        "CachingAllocator::free: the block was not allocated by this cache "
        "or was freed twice");
  }
  const BlockInfo info = it->second;
  in_use_.erase(it);
  stats_.bytes_in_use -= info.size;
  stats_.bytes_cached += info.size;
  cached_[{info.stream, info.size}].push_back(block);
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  for (auto& [key, blocks] : cached_) {
    for (void* block : blocks) {
      underlying_.release(block);
      ++stats_.underlying_releases;
    }
  }
  cached_.clear();
  stats_.bytes_cached = 0;
}

CachingAllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace dlaunch::kernels
