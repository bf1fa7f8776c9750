#include "worker/metrics/tf_record.h"

#include <boost/crc.hpp>

namespace dlaunch::metrics {
namespace {

// The reader decodes these fields little-endian whatever the host: write them byte by byte.
void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  // Castagnoli's polynomial, reflected in and out, initial and final XOR all ones: CRC-32C.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  return crc.checksum();
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string frame_tf_record(const std::string& data) {
  std::string length;
  append_le(length, data.size(), 8);
  std::string out = length;
  append_le(out, masked_crc32c(length.data(), length.size()), 4);
  out += data;
  append_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

}  // namespace dlaunch::metrics
