// Counter-based randomness: every random decision in the data pipeline is a pure function of
// (seed, epoch, sample index, ...), so it does not depend on which worker handles the sample,
// on the world size, on what ran before, or on the device: this header compiles as C++ and as
// CUDA, so the CPU loader and the GPU augmentation kernel (kernels/augment.h) draw the same
// numbers. SplitMix64 is enough for augmentation and shuffling and is trivially reproducible.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"  // DL_HOST_DEVICE

namespace dlaunch::kernels {

DL_HOST_DEVICE uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

DL_HOST_DEVICE uint64_t hash_combine(uint64_t a, uint64_t b) {
  return splitmix64(a ^ splitmix64(b));
}

// A small sequential generator seeded by a hash; next() advances a SplitMix64 stream.
class SplitMix {
 public:
  DL_HOST_DEVICE explicit SplitMix(uint64_t seed) : state_(seed) {}
  DL_HOST_DEVICE uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) (n > 0); the modulo bias is negligible for our n << 2^64.
  DL_HOST_DEVICE uint64_t below(uint64_t n) { return next() % n; }
  // Uniform in [0, 1).
  DL_HOST_DEVICE double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace dlaunch::kernels
