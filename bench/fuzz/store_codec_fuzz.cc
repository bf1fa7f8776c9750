// libFuzzer target over the store wire decoder. Properties checked on every input:
//   - decoding never reads past the input (ASan) and never hangs;
//   - an accepted request consumed between 1 byte and the input size;
//   - re-encoding an accepted request reproduces exactly the bytes it was decoded from.
// The first input byte picks the dialect; the rest is a byte stream decoded request by request,
// as the server does.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "rendezvous/tcp/store_codec.h"

using namespace dlaunch;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  wire::Limits limits;
  limits.max_value_bytes = 1 << 20;
  limits.max_frame_bytes = 4 << 20;
  wire::Dialect dialect = data[0] & 1 ? wire::Dialect::kTorch2 : wire::Dialect::kTorch113;
  ++data;
  --size;
  auto detect = wire::detect_dialect(data, size, limits);
  if (detect.status == wire::Status::kOk && detect.consumed > size) abort();
  size_t pos = 0;
  // One Request for every frame of the input, as the server reuses one: a field left over from
  // an earlier frame would break the re-encode check below.
  wire::Request q;
  while (pos < size) {
    auto r = wire::decode_request(dialect, data + pos, size - pos, limits, &q);
    if (r.status != wire::Status::kOk) break;
    if (r.consumed == 0 || r.consumed > size - pos) abort();
    Bytes again;
    wire::encode_request(dialect, q, again);
    if (again.size() != r.consumed || std::memcmp(again.data(), data + pos, r.consumed) != 0) {
      abort();
    }
    pos += r.consumed;
  }
  return 0;
}
