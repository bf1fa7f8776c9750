#include "rendezvous/store_codec.h"

#include "common/byte_order.h"
#include "common/error.h"

namespace dlaunch::wire {

const char* op_name(Op op) {
  switch (op) {
    case Op::kValidate: return "VALIDATE";
    case Op::kPing: return "PING";
    case Op::kSet: return "SET";
    case Op::kCompareSet: return "COMPARE_SET";
    case Op::kGet: return "GET";
    case Op::kAdd: return "ADD";
    case Op::kCheck: return "CHECK";
    case Op::kWait: return "WAIT";
    case Op::kNumKeys: return "GETNUMKEYS";
    case Op::kWatchKey: return "WATCH_KEY";
    case Op::kDeleteKey: return "DELETE_KEY";
    case Op::kAppend: return "APPEND";
    case Op::kMultiGet: return "MULTI_GET";
    case Op::kMultiSet: return "MULTI_SET";
    case Op::kCancelWait: return "CANCEL_WAIT";
    case Op::kQueuePush: return "QUEUE_PUSH";
    case Op::kQueuePop: return "QUEUE_POP";
    case Op::kQueueLen: return "QUEUE_LEN";
    case Op::kAuthBegin: return "AUTH_BEGIN";
    case Op::kAuthProof: return "AUTH_PROOF";
    case Op::kDeletePrefix: return "DELETE_PREFIX";
    case Op::kDeclareAgent: return "DECLARE_AGENT";
  }
  return "?";
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
      return fail("key count " + std::to_string(*n) + " over the limit of " +
                  std::to_string(limits_.max_keys));
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
      return fail(std::string(what) + " of " + std::to_string(*n) + " bytes over the limit of " +
                  std::to_string(limit));
    }
    if (!have(*n)) return false;
    *at = data_ + pos_;
    pos_ += *n;
    return true;
  }
  bool have(uint64_t n) {
    if (n > limits_.max_frame_bytes || pos_ + n > limits_.max_frame_bytes) {
      return fail("request larger than the frame limit of " +
                  std::to_string(limits_.max_frame_bytes) + " bytes");
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
  if (dialect == Dialect::kTorch113) {
    static constexpr Op kOps[] = {Op::kSet,  Op::kCompareSet, Op::kGet,
                                  Op::kAdd,  Op::kCheck,      Op::kWait,
                                  Op::kNumKeys, Op::kWatchKey, Op::kDeleteKey};
    if (code >= sizeof(kOps) / sizeof(kOps[0])) return false;
    *op = kOps[code];
    return true;
  }
  static constexpr Op kOps[] = {Op::kValidate, Op::kSet,       Op::kCompareSet, Op::kGet,
                                Op::kAdd,      Op::kCheck,     Op::kWait,       Op::kNumKeys,
                                Op::kDeleteKey, Op::kAppend,   Op::kMultiGet,   Op::kMultiSet,
                                Op::kCancelWait, Op::kPing,    Op::kQueuePush,  Op::kQueuePop,
                                Op::kQueueLen};
  if (code == op2::kAuthBegin) {
    *op = Op::kAuthBegin;
    return true;
  }
  if (code == op2::kAuthProof) {
    *op = Op::kAuthProof;
    return true;
  }
  if (code == op2::kDeletePrefix) {
    *op = Op::kDeletePrefix;
    return true;
  }
  if (code == op2::kDeclareAgent) {
    *op = Op::kDeclareAgent;
    return true;
  }
  if (code >= sizeof(kOps) / sizeof(kOps[0])) return false;
  *op = kOps[code];
  return true;
}

// Reads the arguments of `op`. False with r.error() empty: need more bytes.
bool read_args(Reader& r, Request* q) {
  switch (q->op) {
    case Op::kValidate:
    case Op::kPing:
      return r.u32(&q->u32);
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      q->keys.resize(1);
      q->values.resize(1);
      return r.key(&q->keys[0]) && r.value(&q->values[0]);
    case Op::kCompareSet:
      q->keys.resize(1);
      q->values.resize(2);
      return r.key(&q->keys[0]) && r.value(&q->values[0]) && r.value(&q->values[1]);
    case Op::kGet:
    case Op::kWatchKey:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
    case Op::kDeletePrefix:
      q->keys.resize(1);
      return r.key(&q->keys[0]);
    case Op::kAdd:
      q->keys.resize(1);
      return r.key(&q->keys[0]) && r.i64(&q->delta);
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet: {
      uint64_t n;
      if (!r.count(&n)) return false;
      q->keys.resize(n);
      for (auto& k : q->keys) {
        if (!r.key(&k)) return false;
      }
      return true;
    }
    case Op::kMultiSet: {
      uint64_t n;
      if (!r.count(&n)) return false;
      q->keys.resize(n);
      q->values.resize(n);
      for (uint64_t i = 0; i < n; ++i) {
        if (!r.key(&q->keys[i]) || !r.value(&q->values[i])) return false;
      }
      return true;
    }
    case Op::kNumKeys:
    case Op::kCancelWait:
    case Op::kDeclareAgent:
      return true;
    case Op::kAuthBegin:
    case Op::kAuthProof:
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
    result.error = "unknown opcode " + std::to_string(code) + " for the " +
                   (dialect == Dialect::kTorch113 ? "PyTorch 1.13" : "PyTorch 2.x") + " dialect";
    return result;
  }
  q.delta = 0;
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
  switch (q.op) {
    case Op::kValidate:
    case Op::kPing:
    case Op::kNumKeys:
    case Op::kCancelWait:
    case Op::kAuthBegin:
    case Op::kAuthProof:
    case Op::kDeclareAgent:
      q.keys.clear();
      q.values.clear();
      break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
    case Op::kCompareSet:
    case Op::kMultiSet:
      break;
    default:
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
  if (dialect == Dialect::kTorch113) {
    switch (op) {
      case Op::kSet: return op113::kSet;
      case Op::kCompareSet: return op113::kCompareSet;
      case Op::kGet: return op113::kGet;
      case Op::kAdd: return op113::kAdd;
      case Op::kCheck: return op113::kCheck;
      case Op::kWait: return op113::kWait;
      case Op::kNumKeys: return op113::kNumKeys;
      case Op::kWatchKey: return op113::kWatchKey;
      case Op::kDeleteKey: return op113::kDeleteKey;
      default:
        throw UsageError(std::string("the PyTorch 1.13 dialect has no ") + op_name(op));
    }
  }
  switch (op) {
    case Op::kValidate: return op2::kValidate;
    case Op::kSet: return op2::kSet;
    case Op::kCompareSet: return op2::kCompareSet;
    case Op::kGet: return op2::kGet;
    case Op::kAdd: return op2::kAdd;
    case Op::kCheck: return op2::kCheck;
    case Op::kWait: return op2::kWait;
    case Op::kNumKeys: return op2::kNumKeys;
    case Op::kDeleteKey: return op2::kDeleteKey;
    case Op::kAppend: return op2::kAppend;
    case Op::kMultiGet: return op2::kMultiGet;
    case Op::kMultiSet: return op2::kMultiSet;
    case Op::kCancelWait: return op2::kCancelWait;
    case Op::kPing: return op2::kPing;
    case Op::kQueuePush: return op2::kQueuePush;
    case Op::kQueuePop: return op2::kQueuePop;
    case Op::kQueueLen: return op2::kQueueLen;
    case Op::kAuthBegin: return op2::kAuthBegin;
    case Op::kAuthProof: return op2::kAuthProof;
    case Op::kDeletePrefix: return op2::kDeletePrefix;
    case Op::kDeclareAgent: return op2::kDeclareAgent;
    case Op::kWatchKey: break;
  }
  throw UsageError(std::string("the PyTorch 2.x dialect has no ") + op_name(op));
}

void encode_request(Dialect dialect, const Request& q, Bytes& out) {
  put_u8(out, opcode(dialect, q.op));
  switch (q.op) {
    case Op::kValidate:
    case Op::kPing:
      put_u32(out, q.u32);
      break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      put_string(out, q.keys.at(0));
      put_bytes(out, q.values.at(0));
      break;
    case Op::kCompareSet:
      put_string(out, q.keys.at(0));
      put_bytes(out, q.values.at(0));
      put_bytes(out, q.values.at(1));
      break;
    case Op::kGet:
    case Op::kWatchKey:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
    case Op::kDeletePrefix:
      put_string(out, q.keys.at(0));
      break;
    case Op::kAdd:
      put_string(out, q.keys.at(0));
      put_i64(out, q.delta);
      break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      put_u64(out, q.keys.size());
      for (const auto& k : q.keys) put_string(out, k);
      break;
    case Op::kMultiSet:
      put_u64(out, q.keys.size());
      for (size_t i = 0; i < q.keys.size(); ++i) {
        put_string(out, q.keys[i]);
        put_bytes(out, q.values.at(i));
      }
      break;
    case Op::kNumKeys:
    case Op::kCancelWait:
    case Op::kDeclareAgent:
      break;
    case Op::kAuthBegin:
    case Op::kAuthProof:
      put_raw(out, q.digest.data(), q.digest.size());
      break;
  }
}

}  // namespace dlaunch::wire
