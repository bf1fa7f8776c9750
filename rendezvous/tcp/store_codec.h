// The TCP store wire protocol: PyTorch's TCPStore framing in its two dialects, plus dlaunch's
// job-token handshake. Pure functions over byte buffers: no I/O, no allocation beyond the
// decoded request's storage, so the server, the client, the tests and the fuzzer share them.
//
// Framing (both dialects, little-endian): a u8 opcode, then arguments. Strings and values are a
// u64 length then the bytes; counts are u64; ADD's delta is a raw i64; PING's nonce a u32.
//
//   dialect   first bytes on a connection          opcodes
//   1.13      the first request itself             SET=0 COMPARE_SET=1 GET=2 ADD=3 CHECK=4
//                                                  WAIT=5 GETNUMKEYS=6 WATCH_KEY=7 DELETE_KEY=8
//   2.x       VALIDATE=0 + u32 magic 0x3C85F7CE    VALIDATE=0 SET=1 COMPARE_SET=2 GET=3 ADD=4
//                                                  CHECK=5 WAIT=6 GETNUMKEYS=7 DELETE_KEY=8
//                                                  APPEND=9 MULTI_GET=10 MULTI_SET=11
//                                                  CANCEL_WAIT=12 PING=13 QUEUE_PUSH=14
//                                                  QUEUE_POP=15 QUEUE_LEN=16 LIST_KEYS=17
//                                                  BARRIER=18
//   dlaunch   2.x, then AUTH_BEGIN/AUTH_PROOF      AUTH_BEGIN=0xA0 AUTH_PROOF=0xA1
//                                                  DELETE_PREFIX=0xA2 DECLARE_AGENT=0xA3
//                                                  FEATURES=0xA4 WAIT_GET=0xA5
//                                                  DECLARE_RUN=0xA6 CHANNELS=0xA7
//                                                  WILL=0xA8 (2.x only)
//
// docs/store_protocol.md has every request and reply layout.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "rendezvous/store/store.h"

namespace dlaunch::wire {

inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;

enum class Dialect : uint8_t { kTorch113, kTorch2 };

// Opcodes as numbered on the wire.
namespace op113 {
inline constexpr uint8_t kSet = 0, kCompareSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5,
                         kNumKeys = 6, kWatchKey = 7, kDeleteKey = 8;
}
namespace op2 {
inline constexpr uint8_t kValidate = 0, kSet = 1, kCompareSet = 2, kGet = 3, kAdd = 4,
                         kCheck = 5, kWait = 6, kNumKeys = 7, kDeleteKey = 8, kAppend = 9,
                         kMultiGet = 10, kMultiSet = 11, kCancelWait = 12, kPing = 13,
                         kQueuePush = 14, kQueuePop = 15, kQueueLen = 16, kListKeys = 17,
                         kBarrier = 18,
                         // dlaunch's extension, accepted only in the 2.x dialect.
                         kAuthBegin = 0xA0, kAuthProof = 0xA1, kDeletePrefix = 0xA2,
                         kDeclareAgent = 0xA3, kFeatures = 0xA4, kWaitGet = 0xA5,
                         kDeclareRun = 0xA6, kChannels = 0xA7, kWill = 0xA8;
}

// FEATURES' reply: a u32 of these bits, what this server does beyond DECLARE_AGENT. A server
// older than FEATURES closes the connection on it instead (an unknown opcode): the client then
// connects again without asking and uses none (docs/store_protocol.md).
inline constexpr uint32_t kFeatureWaitGet = 1u << 0;
// DECLARE_RUN: the server knows the run it serves and refuses agents of another run.
inline constexpr uint32_t kFeatureDeclareRun = 1u << 1;
// CHANNELS: one connection carries many clients' connections (a node's store proxy;
// rendezvous/tcp/channel_frames.h).
inline constexpr uint32_t kFeatureChannels = 1u << 2;
// SHARED and GROUP_SAME channel frames: a combined GROUP whose members' replies are the same
// bytes is answered with those bytes once, for the proxy to copy to each; a GROUP whose
// members sent the same bytes comes up with them once (channel_frames.h).
inline constexpr uint32_t kFeatureSharedReplies = 1u << 3;
// WILL: a connection's last will, a counter the server adds 1 to when the connection ends
// without clearing it first (its process died, or the connection broke).
inline constexpr uint32_t kFeatureWill = 1u << 4;
inline constexpr uint32_t kServerFeatures = kFeatureWaitGet | kFeatureDeclareRun |
                                            kFeatureChannels | kFeatureSharedReplies |
                                            kFeatureWill;

// Reply codes (u8).
inline constexpr uint8_t kCheckReady = 0, kCheckNotReady = 1;
inline constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;
inline constexpr uint8_t kWaitTimedOut = 2;  // WAIT_GET's answer when its timeout passed first
// DECLARE_AGENT's and DECLARE_RUN's answer. A refusal is the last thing the server sends on
// that connection: it closes it after the reply (and, for another run, the run it serves).
inline constexpr uint8_t kDeclareAccepted = 0;
inline constexpr uint8_t kDeclareRefusedNoToken = 1;   // the store requires the job token
inline constexpr uint8_t kDeclareRefusedOtherRun = 2;  // then a string: the run it serves
inline constexpr uint8_t kWatchKeyUpdated = 0, kWatchKeyCreated = 1, kWatchKeyDeleted = 2,
                         kWatchCallbackRegistered = 3;

// One decoded request, dialect-neutral. store_codec.cc's kOpTable gives each op, in this order,
// its name, its opcode in each dialect and the shape of its arguments.
enum class Op : uint8_t {
  kValidate, kPing, kSet, kCompareSet, kGet, kAdd, kCheck, kWait, kNumKeys, kWatchKey,
  kDeleteKey, kAppend, kMultiGet, kMultiSet, kCancelWait, kQueuePush, kQueuePop, kQueueLen,
  kListKeys, kBarrier, kAuthBegin, kAuthProof, kDeletePrefix, kDeclareAgent, kFeatures,
  kWaitGet, kDeclareRun, kChannels, kWill,
};
inline constexpr size_t kOpCount = static_cast<size_t>(Op::kWill) + 1;
const char* op_name(Op op);

inline constexpr size_t kNonceBytes = 32;
using Digest = std::array<uint8_t, 32>;

struct Request {
  Op op = Op::kPing;
  std::vector<std::string> keys;  // SET/GET/...: one; CHECK/WAIT/MULTI_*: several; DECLARE_RUN:
                                  // the run id; WILL: its counter (empty: clear the will)
  std::vector<Bytes> values;      // SET/APPEND/QUEUE_PUSH: one; COMPARE_SET: expected, desired
  int64_t delta = 0;              // ADD; BARRIER's world size
  uint64_t timeout_ms = 0;        // WAIT_GET: answered at the latest after this (0: no limit)
  uint32_t u32 = 0;               // VALIDATE magic, PING nonce
  Digest digest{};                // AUTH_BEGIN client nonce, AUTH_PROOF proof
};

// Caps that keep one client from making the server allocate without bound. A frame over a cap
// is answered kBad before any of it is buffered past the length field.
struct Limits {
  uint64_t max_key_bytes = 64 * 1024;
  uint64_t max_value_bytes = 64ull << 20;  // one value
  uint64_t max_keys = 128 * 1024;          // keys in one CHECK/WAIT/MULTI_*
  uint64_t max_frame_bytes = 256ull << 20; // one whole request
};

enum class Status : uint8_t { kOk, kNeedMore, kBad };

struct DecodeResult {
  Status status = Status::kNeedMore;
  size_t consumed = 0;  // bytes of the request when kOk
  std::string error;    // why, when kBad
};

struct DetectResult {
  Status status = Status::kNeedMore;
  Dialect dialect = Dialect::kTorch113;
  size_t consumed = 0;  // 5 for a 2.x VALIDATE (consumed with the detection), 0 for 1.13
  std::string error;
};

// Tells the dialect from a connection's first bytes. A 2.x client opens with VALIDATE (0x00)
// and the magic; a 1.13 client with a request, whose opcode 0 (SET) is followed by a u64 key
// length: its low 4 bytes equal the magic only for a key near 1 GiB, over any sane cap.
DetectResult detect_dialect(const uint8_t* data, size_t size, const Limits& limits);

// Decodes one request from the front of [data, data+size) into *out, reusing its vectors and
// strings (pass the same Request again to avoid allocations). On kOk *out holds exactly the
// request (arguments the op does not carry are empty); on kNeedMore/kBad it holds leftovers.
// Does no I/O.
DecodeResult decode_request(Dialect dialect, const uint8_t* data, size_t size,
                            const Limits& limits, Request* out);

// Encoding: requests (our client, tests) and replies (the server). Appends to `out`.
void put_u8(Bytes& out, uint8_t v);
void put_u32(Bytes& out, uint32_t v);
void put_u64(Bytes& out, uint64_t v);
void put_i64(Bytes& out, int64_t v);
void put_bytes(Bytes& out, const uint8_t* data, size_t size);  // u64 length + bytes
inline void put_bytes(Bytes& out, const Bytes& b) { put_bytes(out, b.data(), b.size()); }
void put_string(Bytes& out, const std::string& s);
void put_raw(Bytes& out, const uint8_t* data, size_t size);

// The wire opcode of `op` in `dialect`; throws UsageError when the dialect has no such op.
uint8_t opcode(Dialect dialect, Op op);
// Encodes a whole request (the inverse of decode_request).
void encode_request(Dialect dialect, const Request& request, Bytes& out);

}  // namespace dlaunch::wire
