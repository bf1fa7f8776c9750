// TFRecord framing, the container of TensorBoard event files: each record is
//   uint64 length | uint32 masked CRC32C of the length bytes | data | uint32 masked CRC32C of data
// little-endian. A reader checks both CRCs, so a record torn by a crash (or garbage after the
// last one) is recognised and skipped rather than parsed. Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dlaunch::metrics {

// CRC-32C (Castagnoli), as TensorFlow computes it.
uint32_t crc32c(const void* data, size_t size);
// TFRecord stores CRCs masked (rotated and offset): the CRC of data that itself holds CRCs is
// then unlikely to look valid by accident.
uint32_t masked_crc32c(const void* data, size_t size);
// `data` with its TFRecord frame around it, ready to append to a file.
std::string frame_tf_record(const std::string& data);

}  // namespace dlaunch::metrics
