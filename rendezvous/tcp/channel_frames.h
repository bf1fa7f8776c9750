// Channels: one connection that carries many clients' connections, so a node's store proxy
// (rendezvous/proxy/store_proxy.h) keeps one connection to the job's store for all its
// workers. Pure functions over byte buffers, like store_codec.h.
//
// A 2.x connection that proved the job token (or any, on a store without one) sends CHANNELS
// (0xA7) and reads `u8` 0; from then on both directions carry only these frames (little-endian):
//
//   proxy -> store
//     OPEN   = 0  u32 channel                       a client connected (ids never reused)
//     DATA   = 1  u32 channel, u64 length, bytes    what the client sent, as it sent it
//     CLOSE  = 2  u32 channel                       the client disconnected
//     GROUP  = 3  u32 count, then count times       the same request from several channels,
//                 (u32 channel, u64 length, bytes)  received together (see below)
//     SHARED = 4  (nothing more)                    this proxy reads the store's SHARED frames;
//                                                   sent once, first, and only to a store whose
//                                                   FEATURES has kFeatureSharedReplies
//     GROUP_SAME  u32 count, count times u32        a GROUP whose members' bytes are all the
//            = 5  channel, then u64 length, bytes   same, sent once (same store feature)
//   store -> proxy
//     DATA   = 1  u32 channel, u64 length, bytes    what the store sends that client
//     CLOSED = 2  u32 channel                       the store closed that client's connection
//     SHARED = 4  u32 count, count times u32        the same bytes for each of those clients,
//                 channel, then u64 length, bytes   as if each had its own DATA frame
//
// The store runs one session per channel, exactly as for a connection of its own: dialect,
// job token, worker namespace, parked and pending waits, timeouts, errors. A GROUP is the
// store's to combine: when every member is one GET, MULTI_GET, CHECK, WAIT or ADD of the same
// keys, each channel
// idle, the store answers them all from one look at the table (an ADD of the sum, each member
// its own prefix of it: the members in the order listed, one after the other); otherwise it
// handles the members as DATA frames in the order listed. Either way each client reads what it
// would have read had the store taken the requests one by one in that order at that moment.
// When a combined group's replies are byte for byte the same (GETs, MULTI_GETs, CHECKs and
// WAITs of the same keys in the same namespace), a store told SHARED sends them as one SHARED
// frame: the bytes cross the store host's socket once per group instead of once per member.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "rendezvous/tcp/store_codec.h"

namespace dlaunch::wire {

enum class ChannelFrameKind : uint8_t {
  kOpen = 0, kData = 1, kClose = 2, kGroup = 3, kShared = 4 };
inline constexpr uint8_t kChannelClosed = 2;  // store -> proxy, as kClose
inline constexpr uint8_t kGroupOfSameBytes = 5;  // proxy -> store; decoded as a kGroup

// One decoded frame; the payloads point into the buffer that was decoded.
struct ChannelPayload {
  uint32_t channel = 0;
  const uint8_t* data = nullptr;
  size_t size = 0;
};
struct ChannelFrame {
  ChannelFrameKind kind = ChannelFrameKind::kData;
  uint32_t channel = 0;                 // OPEN, DATA, CLOSE
  std::vector<ChannelPayload> members;  // DATA: one; GROUP: each member; the store's SHARED:
                                        // one per channel, all pointing at the same bytes
};

// Decodes one frame from the front of [data, data+size). A payload over
// limits.max_frame_bytes or a GROUP of more than limits.max_keys members is kBad; so is an
// unknown kind. `from_store`: the store's direction (DATA and CLOSED only).
DecodeResult decode_channel_frame(const uint8_t* data, size_t size, const Limits& limits,
                                  bool from_store, ChannelFrame* out);

// Encoders; they append to `out`.
void put_channel_open(Bytes& out, uint32_t channel);
void put_channel_data(Bytes& out, uint32_t channel, const uint8_t* data, size_t size);
void put_channel_close(Bytes& out, uint32_t channel);  // CLOSE, and the store's CLOSED
// A GROUP of `members` (channel and its one request's bytes each).
void put_channel_group(Bytes& out, const std::vector<ChannelPayload>& members);
// The proxy's SHARED (no body): it reads the store's SHARED frames.
void put_channel_shared_accepted(Bytes& out);
// The proxy's GROUP_SAME: a GROUP of `channels`, each of which sent the same `size` bytes.
void put_channel_group_of_same_bytes(Bytes& out, const std::vector<uint32_t>& channels,
                                     const uint8_t* data, size_t size);
// The store's SHARED: the same `size` bytes for every channel of `channels`.
void put_channel_shared(Bytes& out, const std::vector<uint32_t>& channels, const uint8_t* data,
                        size_t size);

}  // namespace dlaunch::wire
