// SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), for the store's job-token handshake. Small
// and dependency-free on purpose: the rendezvous library links only common, Boost headers and
// fmt. Checked against the FIPS and RFC 4231 test vectors (tests/rendezvous/sha256_test.cc).
// Never blocks, never throws.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dlaunch {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  Sha256Digest finish();

 private:
  void block(const uint8_t* p);

  uint32_t h_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

Sha256Digest sha256(const void* data, size_t size);
Sha256Digest hmac_sha256(const void* key, size_t key_size, const void* data, size_t size);
std::string to_hex(const uint8_t* data, size_t size);

// Compares in time independent of where the first difference is.
bool constant_time_equal(const uint8_t* a, const uint8_t* b, size_t size);

}  // namespace dlaunch
