#include "rendezvous/tcp/store_codec.h"

#include <fmt/format.h>

#include "common/byte_order.h"
#include "common/error.h"

namespace dlaunch::wire {

namespace {

// What follows an op's opcode on the wire: decode_request, encode_request and the emptying of
// the arguments an op does not carry all go by this.
enum class Args : uint8_t {
  kNone,           // GETNUMKEYS, CANCEL_WAIT, LIST_KEYS, DECLARE_AGENT, FEATURES, CHANNELS
  kU32,            // VALIDATE magic, PING nonce
  kKey,            // key (DECLARE_RUN: the run id; WILL: its counter, empty to clear)
  kKeyValue,       // key, value
  kKeyTwoValues,   // key, expected, desired (COMPARE_SET)
  kKeyDelta,       // key, i64 (ADD's delta, BARRIER's world size)
  kKeys,           // u64 count, keys (CHECK, WAIT, MULTI_GET)
  kTimeoutKeys,    // u64 timeout in ms, u64 count, keys (WAIT_GET)
  kKeyValuePairs,  // u64 count, (key, value) pairs (MULTI_SET)
  kDigest,         // 32 raw bytes (AUTH_BEGIN nonce, AUTH_PROOF proof)
};

constexpr int16_t kNoCode = -1;

// The op set, in Op's order: one row per op, its name, its opcode in each dialect (kNoCode: the
// dialect has no such op) and its arguments.
struct OpRow {
  Op op;
  const char* name;
  int16_t code113;
  int16_t code2;
  Args args;
};

constexpr OpRow kOpTable[] = {
    {Op::kValidate, "VALIDATE", kNoCode, op2::kValidate, Args::kU32},
    {Op::kPing, "PING", kNoCode, op2::kPing, Args::kU32},
    {Op::kSet, "SET", op113::kSet, op2::kSet, Args::kKeyValue},
    {Op::kCompareSet, "COMPARE_SET", op113::kCompareSet, op2::kCompareSet, Args::kKeyTwoValues},
    {Op::kGet, "GET", op113::kGet, op2::kGet, Args::kKey},
    {Op::kAdd, "ADD", op113::kAdd, op2::kAdd, Args::kKeyDelta},
    {Op::kCheck, "CHECK", op113::kCheck, op2::kCheck, Args::kKeys},
    {Op::kWait, "WAIT", op113::kWait, op2::kWait, Args::kKeys},
    {Op::kNumKeys, "GETNUMKEYS", op113::kNumKeys, op2::kNumKeys, Args::kNone},
    {Op::kWatchKey, "WATCH_KEY", op113::kWatchKey, kNoCode, Args::kKey},
    {Op::kDeleteKey, "DELETE_KEY", op113::kDeleteKey, op2::kDeleteKey, Args::kKey},
    {Op::kAppend, "APPEND", kNoCode, op2::kAppend, Args::kKeyValue},
    {Op::kMultiGet, "MULTI_GET", kNoCode, op2::kMultiGet, Args::kKeys},
    {Op::kMultiSet, "MULTI_SET", kNoCode, op2::kMultiSet, Args::kKeyValuePairs},
    {Op::kCancelWait, "CANCEL_WAIT", kNoCode, op2::kCancelWait, Args::kNone},
    {Op::kQueuePush, "QUEUE_PUSH", kNoCode, op2::kQueuePush, Args::kKeyValue},
    {Op::kQueuePop, "QUEUE_POP", kNoCode, op2::kQueuePop, Args::kKey},
    {Op::kQueueLen, "QUEUE_LEN", kNoCode, op2::kQueueLen, Args::kKey},
    {Op::kListKeys, "LIST_KEYS", kNoCode, op2::kListKeys, Args::kNone},
    {Op::kBarrier, "BARRIER", kNoCode, op2::kBarrier, Args::kKeyDelta},
    {Op::kAuthBegin, "AUTH_BEGIN", kNoCode, op2::kAuthBegin, Args::kDigest},
    {Op::kAuthProof, "AUTH_PROOF", kNoCode, op2::kAuthProof, Args::kDigest},
    {Op::kDeletePrefix, "DELETE_PREFIX", kNoCode, op2::kDeletePrefix, Args::kKey},
    {Op::kDeclareAgent, "DECLARE_AGENT", kNoCode, op2::kDeclareAgent, Args::kNone},
    {Op::kFeatures, "FEATURES", kNoCode, op2::kFeatures, Args::kNone},
    {Op::kWaitGet, "WAIT_GET", kNoCode, op2::kWaitGet, Args::kTimeoutKeys},
    {Op::kDeclareRun, "DECLARE_RUN", kNoCode, op2::kDeclareRun, Args::kKey},
    {Op::kChannels, "CHANNELS", kNoCode, op2::kChannels, Args::kNone},
    {Op::kWill, "WILL", kNoCode, op2::kWill, Args::kKey},
};
constexpr size_t kNumOps = sizeof(kOpTable) / sizeof(kOpTable[0]);

constexpr bool table_in_op_order() {
  for (size_t i = 0; i < kNumOps; ++i) {
    if (static_cast<size_t>(kOpTable[i].op) != i) return false;
  }
  return kOpCount == kNumOps;
}
static_assert(table_in_op_order(), "kOpTable must list every Op once, in Op's order");

const OpRow& row(Op op) { return kOpTable[static_cast<size_t>(op)]; }

// Opcode -> index into kOpTable for one dialect (-1: unknown), derived from the table so
// decoding is one lookup.
struct OpcodeMap {
  int8_t index[256];
};

constexpr OpcodeMap make_opcode_map(Dialect dialect) {
  OpcodeMap map{};
  for (auto& i : map.index) i = -1;
  for (size_t i = 0; i < kNumOps; ++i) {
    int16_t code = dialect == Dialect::kTorch113 ? kOpTable[i].code113 : kOpTable[i].code2;
    if (code != kNoCode) map.index[code] = static_cast<int8_t>(i);
  }
  return map;
}
constexpr OpcodeMap kOpcodes113 = make_opcode_map(Dialect::kTorch113);
constexpr OpcodeMap kOpcodes2 = make_opcode_map(Dialect::kTorch2);

}  // namespace

const char* op_name(Op op) {
  return static_cast<size_t>(op) < kNumOps ? row(op).name : "?";
}

namespace {

// A cursor over the input. Each read answers false when the bytes are not there yet; `bad` is
// set (and reads fail) when a length breaks a limit.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const Limits& limits)
      : data_(data), size_(size), limits_(limits) {}

  bool u8(uint8_t* v) {
    if (!have(1)) return false;
    *v = data_[pos_++];
    return true;
  }
  bool u32(uint32_t* v) {
    if (!have(4)) return false;
    *v = load_le<uint32_t>(data_ + pos_);
    pos_ += 4;
    return true;
  }
  bool u64(uint64_t* v) {
    if (!have(8)) return false;
    *v = load_le<uint64_t>(data_ + pos_);
    pos_ += 8;
    return true;
  }
  bool i64(int64_t* v) {
    uint64_t u;
    if (!u64(&u)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool digest(Digest* d) {
    if (!have(d->size())) return false;
    std::copy(data_ + pos_, data_ + pos_ + d->size(), d->begin());
    pos_ += d->size();
    return true;
  }
  bool count(uint64_t* n) {
    if (!u64(n)) return false;
    if (*n > limits_.max_keys) {
      return fail(fmt::format("key count {} over the limit of {}", *n, limits_.max_keys));
    }
    return true;
  }
  bool key(std::string* s) {
    const uint8_t* at = nullptr;
    uint64_t n = 0;
    if (!sized(limits_.max_key_bytes, "key", &at, &n)) return false;
    s->assign(reinterpret_cast<const char*>(at), n);
    return true;
  }
  bool value(Bytes* b) {
    const uint8_t* at = nullptr;
    uint64_t n = 0;
    if (!sized(limits_.max_value_bytes, "value", &at, &n)) return false;
    b->assign(at, at + n);
    return true;
  }
  bool fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
    return false;
  }

  size_t pos() const { return pos_; }
  const std::string& error() const { return error_; }

 private:
  // A u64 length of at most `limit` bytes, then the bytes themselves (returned in place).
  bool sized(uint64_t limit, const char* what, const uint8_t** at, uint64_t* n) {
    if (!u64(n)) return false;
    if (*n > limit) {
      return fail(fmt::format("{} of {} bytes over the limit of {}", what, *n, limit));
    }
    if (!have(*n)) return false;
    *at = data_ + pos_;
    pos_ += *n;
    return true;
  }
  bool have(uint64_t n) {
    if (n > limits_.max_frame_bytes || pos_ + n > limits_.max_frame_bytes) {
      return fail(
          fmt::format("request larger than the frame limit of {} bytes", limits_.max_frame_bytes));
    }
    return size_ - pos_ >= n;
  }

  const uint8_t* data_;
  size_t size_;
  const Limits& limits_;
  size_t pos_ = 0;
  std::string error_;
};

bool map_opcode(Dialect dialect, uint8_t code, Op* op) {
  int8_t index = (dialect == Dialect::kTorch113 ? kOpcodes113 : kOpcodes2).index[code];
  if (index < 0) return false;
  *op = kOpTable[index].op;
  return true;
}

// Reads the arguments of `q->op`. False with r.error() empty: need more bytes.
bool read_args(Reader& r, Request* q) {
  switch (row(q->op).args) {
    case Args::kNone:
      return true;
    case Args::kU32:
      return r.u32(&q->u32);
    case Args::kKey:
      q->keys.resize(1);
      return r.key(&q->keys[0]);
    case Args::kKeyValue:
      q->keys.resize(1);
      q->values.resize(1);
      return r.key(&q->keys[0]) && r.value(&q->values[0]);
    case Args::kKeyTwoValues:
      q->keys.resize(1);
      q->values.resize(2);
      return r.key(&q->keys[0]) && r.value(&q->values[0]) && r.value(&q->values[1]);
    case Args::kKeyDelta:
      q->keys.resize(1);
      return r.key(&q->keys[0]) && r.i64(&q->delta);
    case Args::kTimeoutKeys:
      if (!r.u64(&q->timeout_ms)) return false;
      [[fallthrough]];
    case Args::kKeys: {
      uint64_t n;
      if (!r.count(&n)) return false;
      q->keys.resize(n);
      for (auto& k : q->keys) {
        if (!r.key(&k)) return false;
      }
      return true;
    }
    case Args::kKeyValuePairs: {
      uint64_t n;
      if (!r.count(&n)) return false;
      q->keys.resize(n);
      q->values.resize(n);
      for (uint64_t i = 0; i < n; ++i) {
        if (!r.key(&q->keys[i]) || !r.value(&q->values[i])) return false;
      }
      return true;
    }
    case Args::kDigest:
      return r.digest(&q->digest);
  }
  return r.fail("unhandled opcode");
}

}  // namespace

DetectResult detect_dialect(const uint8_t* data, size_t size, const Limits& limits) {
  DetectResult result;
  if (size == 0) return result;
  if (data[0] != op2::kValidate) {
    if (data[0] > op113::kDeleteKey) {
      result.status = Status::kBad;
      result.error = "first byte " + std::to_string(data[0]) +
                     " is neither a PyTorch 1.13 opcode (0-8) nor a 2.x VALIDATE (0)";
      return result;
    }
    result.status = Status::kOk;
    result.dialect = Dialect::kTorch113;
    return result;
  }
  if (size < 5) return result;
  if (load_le<uint32_t>(data + 1) == kValidationMagic) {
    result.status = Status::kOk;
    result.dialect = Dialect::kTorch2;
    result.consumed = 5;
    return result;
  }
  // A 1.13 SET: its key length must be sane.
  if (size >= 9 && load_le<uint64_t>(data + 1) > limits.max_key_bytes) {
    result.status = Status::kBad;
    result.error = "first request is neither a 2.x VALIDATE (wrong magic) nor a sane 1.13 SET";
    return result;
  }
  result.status = Status::kOk;
  result.dialect = Dialect::kTorch113;
  return result;
}

DecodeResult decode_request(Dialect dialect, const uint8_t* data, size_t size,
                            const Limits& limits, Request* out) {
  DecodeResult result;
  Reader r(data, size, limits);
  uint8_t code;
  if (!r.u8(&code)) return result;
  // Decoded in place: the server reuses one Request, so its vectors and short keys cost no
  // allocation per request.
  Request& q = *out;
  if (!map_opcode(dialect, code, &q.op)) {
    result.status = Status::kBad;
    // Said so that whoever reads the log knows what was expected and what to suspect.
    result.error =
        dialect == Dialect::kTorch113
            ? fmt::format("unknown opcode {} for the PyTorch 1.13 dialect (it has 0-{})", code,
                          op113::kDeleteKey)
            : fmt::format("unknown opcode {} for the PyTorch 2.x dialect (it has 0-{}, and "
                          "dlaunch's {}-{}): a PyTorch newer than this dlaunch knows, or a "
                          "client that is no store client",
                          code, op2::kBarrier, op2::kAuthBegin, op2::kWill);
    return result;
  }
  q.delta = 0;
  q.timeout_ms = 0;
  q.u32 = 0;
  q.digest = Digest{};
  if (!read_args(r, &q)) {
    if (!r.error().empty()) {
      result.status = Status::kBad;
      result.error = std::string(op_name(q.op)) + ": " + r.error();
    }
    return result;
  }
  // Arguments the op does not carry are emptied, so *out is exactly the request.
  switch (row(q.op).args) {
    case Args::kNone:
    case Args::kU32:
    case Args::kDigest:
      q.keys.clear();
      q.values.clear();
      break;
    case Args::kKeyValue:
    case Args::kKeyTwoValues:
    case Args::kKeyValuePairs:
      break;
    case Args::kKey:
    case Args::kKeyDelta:
    case Args::kKeys:
    case Args::kTimeoutKeys:
      q.values.clear();
      break;
  }
  result.status = Status::kOk;
  result.consumed = r.pos();
  return result;
}

void put_u8(Bytes& out, uint8_t v) { out.push_back(v); }
void put_u32(Bytes& out, uint32_t v) {
  size_t at = out.size();
  out.resize(at + 4);
  store_le<uint32_t>(out.data() + at, v);
}
void put_u64(Bytes& out, uint64_t v) {
  size_t at = out.size();
  out.resize(at + 8);
  store_le<uint64_t>(out.data() + at, v);
}
void put_i64(Bytes& out, int64_t v) { put_u64(out, static_cast<uint64_t>(v)); }
void put_raw(Bytes& out, const uint8_t* data, size_t size) {
  out.insert(out.end(), data, data + size);
}
void put_bytes(Bytes& out, const uint8_t* data, size_t size) {
  put_u64(out, size);
  put_raw(out, data, size);
}
void put_string(Bytes& out, const std::string& s) {
  put_bytes(out, reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

uint8_t opcode(Dialect dialect, Op op) {
  const OpRow& r = row(op);
  int16_t code = dialect == Dialect::kTorch113 ? r.code113 : r.code2;
  if (code == kNoCode) {
    throw UsageError(fmt::format("the PyTorch {} dialect has no {}",
                                 dialect == Dialect::kTorch113 ? "1.13" : "2.x", r.name));
  }
  return static_cast<uint8_t>(code);
}

void encode_request(Dialect dialect, const Request& q, Bytes& out) {
  put_u8(out, opcode(dialect, q.op));
  switch (row(q.op).args) {
    case Args::kNone:
      break;
    case Args::kU32:
      put_u32(out, q.u32);
      break;
    case Args::kKey:
      put_string(out, q.keys.at(0));
      break;
    case Args::kKeyValue:
      put_string(out, q.keys.at(0));
      put_bytes(out, q.values.at(0));
      break;
    case Args::kKeyTwoValues:
      put_string(out, q.keys.at(0));
      put_bytes(out, q.values.at(0));
      put_bytes(out, q.values.at(1));
      break;
    case Args::kKeyDelta:
      put_string(out, q.keys.at(0));
      put_i64(out, q.delta);
      break;
    case Args::kTimeoutKeys:
      put_u64(out, q.timeout_ms);
      [[fallthrough]];
    case Args::kKeys:
      put_u64(out, q.keys.size());
      for (const auto& k : q.keys) put_string(out, k);
      break;
    case Args::kKeyValuePairs:
      put_u64(out, q.keys.size());
      for (size_t i = 0; i < q.keys.size(); ++i) {
        put_string(out, q.keys[i]);
        put_bytes(out, q.values.at(i));
      }
      break;
    case Args::kDigest:
      put_raw(out, q.digest.data(), q.digest.size());
      break;
  }
}

}  // namespace dlaunch::wire
