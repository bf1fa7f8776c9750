// A caching allocator for device memory: freed blocks stay cached per (stream, size class) and
// serve the next request of that class on that stream, so a training loop whose steps allocate
// the same tensors every step makes no underlying (cudaMalloc) calls after its first steps.
// The underlying allocator is injected, which lets tests count its calls on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dlaunch::kernels {

// What the cache allocates from: allocate returns nullptr when the device is out of memory
// (the cache then releases what it holds and tries once more); release frees one block.
struct UnderlyingAllocator {
  std::function<void*(size_t bytes)> allocate;
  std::function<void(void* block)> release;
};

// Streams are opaque to the cache (a cudaStream_t's value on CUDA, 0 on a single stream).
using StreamId = std::uintptr_t;

struct CachingAllocatorStats {
  size_t bytes_in_use = 0;  // rounded sizes of the blocks handed out and not yet freed
  size_t bytes_cached = 0;  // freed blocks the cache holds for reuse
  size_t underlying_allocations = 0;
  size_t underlying_releases = 0;
  size_t served_from_cache = 0;  // allocations that reused a cached block
};

class CachingAllocator {
 public:
  explicit CachingAllocator(UnderlyingAllocator underlying);
  ~CachingAllocator();  // releases the cached blocks; blocks still in use are the owner's leak
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` bytes for work ordered on `stream`. Throws std::runtime_error
  // when the underlying allocator fails even after the cache was emptied.
  void* allocate(size_t bytes, StreamId stream);
  // Returns a block to the cache of the stream it was allocated for. A block freed there is
  // reused only by that stream: its pending work is ordered before any later work there, while
  // another stream would need an event to wait on (which this cache does not record).
  void free(void* block);
  // Hands every cached block back to the underlying allocator.
  void release_cached();
  CachingAllocatorStats stats() const;

  // The size class of a request: 512-byte granules below 1 MiB, 128 KiB granules above (at most
  // 12.5% waste), so tensors whose sizes differ slightly still share blocks.
  static size_t rounded_size(size_t bytes);

 private:
  struct BlockInfo {
    size_t size;
    StreamId stream;
  };
  void* allocate_underlying(size_t size);
  void release_cached_locked();

  UnderlyingAllocator underlying_;
  mutable std::mutex mutex_;
  std::map<std::pair<StreamId, size_t>, std::vector<void*>> cached_;  // (stream, size) -> blocks
  std::unordered_map<void*, BlockInfo> in_use_;
  CachingAllocatorStats stats_;
};

}  // namespace dlaunch::kernels
