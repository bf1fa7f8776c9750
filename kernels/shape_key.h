// A fixed number of shape figures as an unordered_map key: the per-shape caches of the CPU
// (oneDNN) and the CUDA (cuDNN) convolutions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dlaunch::kernels {

template <size_t N>
struct ShapeKey {
  int64_t v[N];
  bool operator==(const ShapeKey& o) const { return std::memcmp(v, o.v, sizeof(v)) == 0; }
};

struct ShapeKeyHash {  // FNV-1a over the figures
  template <size_t N>
  size_t operator()(const ShapeKey<N>& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
    return h;
  }
};

}  // namespace dlaunch::kernels
