#include "rendezvous/tcp/channel_frames.h"

#include "common/byte_order.h"

namespace dlaunch::wire {

namespace {

// Reads (u32 channel, u64 length, bytes) at *pos; false when not all there yet or, with `bad`
// set, when the length breaks the limit.
bool read_payload(const uint8_t* data, size_t size, size_t* pos, const Limits& limits,
                  ChannelPayload* out, bool* bad) {
  if (size - *pos < 12) return false;
  out->channel = load_le<uint32_t>(data + *pos);
  uint64_t length = load_le<uint64_t>(data + *pos + 4);
  if (length > limits.max_frame_bytes) {
    *bad = true;
    return false;
  }
  if (size - *pos - 12 < length) return false;
  out->data = data + *pos + 12;
  out->size = static_cast<size_t>(length);
  *pos += 12 + static_cast<size_t>(length);
  return true;
}

}  // namespace

DecodeResult decode_channel_frame(const uint8_t* data, size_t size, const Limits& limits,
                                  bool from_store, ChannelFrame* out) {
  DecodeResult r;
  if (size < 1) return r;
  const uint8_t kind = data[0];
  size_t pos = 1;
  bool bad = false;
  out->members.clear();
  auto fail = [&](std::string why) {
    r.status = Status::kBad;
    r.error = std::move(why);
    return r;
  };
  switch (kind) {
    case static_cast<uint8_t>(ChannelFrameKind::kOpen):
    case static_cast<uint8_t>(ChannelFrameKind::kClose):
      if (from_store && kind == static_cast<uint8_t>(ChannelFrameKind::kOpen)) {
        return fail("channel frame kind OPEN from the store");
      }
      if (size < 5) return r;
      out->kind = static_cast<ChannelFrameKind>(kind);
      out->channel = load_le<uint32_t>(data + 1);
      pos = 5;
      break;
    case static_cast<uint8_t>(ChannelFrameKind::kData): {
      ChannelPayload p;
      if (!read_payload(data, size, &pos, limits, &p, &bad)) {
        return bad ? fail("channel DATA frame over the frame limit") : r;
      }
      out->kind = ChannelFrameKind::kData;
      out->channel = p.channel;
      out->members.push_back(p);
      break;
    }
    case static_cast<uint8_t>(ChannelFrameKind::kGroup): {
      if (from_store) return fail("channel frame kind GROUP from the store");
      if (size < 5) return r;
      const uint32_t count = load_le<uint32_t>(data + 1);
      if (count == 0 || count > limits.max_keys) {
        return fail("channel GROUP of " + std::to_string(count) + " members");
      }
      pos = 5;
      out->kind = ChannelFrameKind::kGroup;
      for (uint32_t i = 0; i < count; ++i) {
        ChannelPayload p;
        if (!read_payload(data, size, &pos, limits, &p, &bad)) {
          out->members.clear();
          return bad ? fail("channel GROUP member over the frame limit") : r;
        }
        out->members.push_back(p);
      }
      break;
    }
    case kGroupOfSameBytes:
    case static_cast<uint8_t>(ChannelFrameKind::kShared): {
      const bool same = kind == kGroupOfSameBytes;
      if (same && from_store) return fail("channel frame kind GROUP_SAME from the store");
      // GROUP_SAME is read as the GROUP it stands for: every member's bytes are the same.
      out->kind = same ? ChannelFrameKind::kGroup : ChannelFrameKind::kShared;
      if (!from_store && !same) break;  // the proxy's SHARED: no body
      if (size < 5) return r;
      const uint32_t count = load_le<uint32_t>(data + 1);
      if (count == 0 || count > limits.max_keys) {
        return fail("channel SHARED frame for " + std::to_string(count) + " channels");
      }
      pos = 5;
      if (size - pos < size_t{4} * count + 8) return r;
      const uint8_t* channels = data + pos;
      pos += size_t{4} * count;
      const uint64_t length = load_le<uint64_t>(data + pos);
      if (length > limits.max_frame_bytes) return fail("channel SHARED frame over the frame limit");
      pos += 8;
      if (size - pos < length) return r;
      for (uint32_t i = 0; i < count; ++i) {
        out->members.push_back(ChannelPayload{load_le<uint32_t>(channels + size_t{4} * i),
                                              data + pos, static_cast<size_t>(length)});
      }
      pos += static_cast<size_t>(length);
      break;
    }
    default:
      return fail("unknown channel frame kind " + std::to_string(kind));
  }
  r.status = Status::kOk;
  r.consumed = pos;
  return r;
}

void put_channel_open(Bytes& out, uint32_t channel) {
  put_u8(out, static_cast<uint8_t>(ChannelFrameKind::kOpen));
  put_u32(out, channel);
}

void put_channel_data(Bytes& out, uint32_t channel, const uint8_t* data, size_t size) {
  put_u8(out, static_cast<uint8_t>(ChannelFrameKind::kData));
  put_u32(out, channel);
  put_bytes(out, data, size);
}

void put_channel_close(Bytes& out, uint32_t channel) {
  put_u8(out, static_cast<uint8_t>(ChannelFrameKind::kClose));
  put_u32(out, channel);
}

void put_channel_group(Bytes& out, const std::vector<ChannelPayload>& members) {
  put_u8(out, static_cast<uint8_t>(ChannelFrameKind::kGroup));
  put_u32(out, static_cast<uint32_t>(members.size()));
  for (const auto& m : members) {
    put_u32(out, m.channel);
    put_bytes(out, m.data, m.size);
  }
}

void put_channel_shared_accepted(Bytes& out) {
  put_u8(out, static_cast<uint8_t>(ChannelFrameKind::kShared));
}

void put_channel_group_of_same_bytes(Bytes& out, const std::vector<uint32_t>& channels,
                                     const uint8_t* data, size_t size) {
  put_u8(out, kGroupOfSameBytes);
  put_u32(out, static_cast<uint32_t>(channels.size()));
  for (uint32_t c : channels) put_u32(out, c);
  put_bytes(out, data, size);
}

void put_channel_shared(Bytes& out, const std::vector<uint32_t>& channels, const uint8_t* data,
                        size_t size) {
  put_u8(out, static_cast<uint8_t>(ChannelFrameKind::kShared));
  put_u32(out, static_cast<uint32_t>(channels.size()));
  for (uint32_t c : channels) put_u32(out, c);
  put_bytes(out, data, size);
}

}  // namespace dlaunch::wire
