// Little-endian load/store helpers for wire formats (the store protocol, checkpoints).
// They work on unaligned bytes and compile to plain moves on little-endian hosts.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace dlaunch {

template <typename T>
inline T load_le(const void* src) {
  static_assert(std::is_integral_v<T>, "integers only");
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, src, sizeof(T));
  std::make_unsigned_t<T> value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<std::make_unsigned_t<T>>(bytes[i]) << (8 * i);
  }
  return static_cast<T>(value);
}

template <typename T>
inline void store_le(void* dst, T value) {
  static_assert(std::is_integral_v<T>, "integers only");
  auto u = static_cast<std::make_unsigned_t<T>>(value);
  unsigned char bytes[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) bytes[i] = static_cast<unsigned char>(u >> (8 * i));
  std::memcpy(dst, bytes, sizeof(T));
}

}  // namespace dlaunch
