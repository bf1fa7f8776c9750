// Store frames written out by hand, readably: the codec's golden tests and the server's
// byte-for-byte tests build requests from these (u8 opcode, little-endian u32/u64, and strings
// as a u64 length then the bytes, as PyTorch's TCPStore writes them).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "rendezvous/store/store.h"

namespace dlaunch::test {

inline Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
inline Bytes u8(uint8_t v) { return {v}; }
inline Bytes u32(uint32_t v) {
  Bytes b(4);
  for (int i = 0; i < 4; ++i) b[i] = uint8_t(v >> (8 * i));
  return b;
}
inline Bytes u64(uint64_t v) {
  Bytes b(8);
  for (int i = 0; i < 8; ++i) b[i] = uint8_t(v >> (8 * i));
  return b;
}
inline Bytes str(const std::string& s) { return cat({u64(s.size()), Bytes(s.begin(), s.end())}); }
// The 2.x client's first request: VALIDATE with the magic number.
inline const Bytes kValidate = cat({u8(0), u32(0x3C85F7CE)});

}  // namespace dlaunch::test
