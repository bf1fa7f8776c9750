// etcd v3 JSON-gateway messages, encoded and decoded without I/O (so every quirk is unit-tested
// without a server). The gateway maps the gRPC API to JSON by protobuf's rules, which gives:
//   - keys and values are base64 (bytes fields);
//   - int64/uint64 fields arrive as decimal strings ("revision": "42");
//   - fields at their default value are omitted: a range that finds nothing has no "kvs", a txn
//     whose compare failed has no "succeeded", a PUT event has no "type", a count of 0 no
//     "count";
//   - a keepalive on an expired or unknown lease answers 200 with no "TTL" (TTL 0 omitted);
//   - streaming calls (watch, keepalive) answer one JSON object per message, each wrapped in
//     {"result": ...} or {"error": ...}, separated by newlines, in a chunked body.
// Errors come back as {"error": "...", "code": N, "message": "..."} with an HTTP error status.
//
// Pure functions; decoders throw ProtocolError on malformed JSON or a wrong shape, naming the
// call and quoting the start of the body.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dlaunch::etcd {

std::string base64_encode(const std::string& bytes);
// Throws ProtocolError on characters outside the alphabet or a bad length.
std::string base64_decode(const std::string& text);

// The smallest key greater than every key starting with `prefix` (etcd's range_end for a
// prefix query): the prefix with its last byte incremented, trailing 0xff bytes dropped;
// "\0" (all keys) when the prefix is empty or all 0xff.
std::string prefix_end(const std::string& prefix);

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct RangeResponse {
  int64_t revision = 0;  // the store's revision when the range was served
  std::vector<KeyValue> kvs;
  int64_t count = 0;
};

// --- transactions ---------------------------------------------------------------------------

struct Compare {
  enum class Target { kVersion, kCreate, kMod, kValue, kLease };
  enum class Result { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kValue;
  Result result = Result::kEqual;
  int64_t number = 0;  // for version/create/mod/lease
  std::string value;   // for value

  static Compare value_equals(std::string key, std::string value);
  static Compare missing(std::string key);  // create_revision == 0
  static Compare mod_revision_equals(std::string key, int64_t revision);
};

struct Op {
  enum class Kind { kPut, kRange, kDelete };
  Kind kind = Kind::kRange;
  std::string key;
  std::string range_end;  // range/delete: empty for one key
  std::string value;      // put
  int64_t lease = 0;      // put
  bool count_only = false;
  // Range only: ascending by create_revision (arrival order), at most `limit` keys (0: all),
  // only keys created at or before `max_create_revision` (0: any).
  bool sort_by_create = false;
  int64_t limit = 0;
  int64_t max_create_revision = 0;

  static Op put(std::string key, std::string value, int64_t lease = 0);
  static Op get(std::string key);
  static Op get_prefix(std::string prefix);
  static Op del(std::string key);
};

struct OpResponse {
  Op::Kind kind = Op::Kind::kRange;
  RangeResponse range;  // for kRange
  int64_t deleted = 0;  // for kDelete
};

struct TxnResponse {
  int64_t revision = 0;
  bool succeeded = false;
  std::vector<OpResponse> responses;  // of the branch that ran, in order
};

// --- watch ----------------------------------------------------------------------------------

struct Event {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;
};

struct WatchMessage {
  int64_t revision = 0;
  int64_t watch_id = 0;
  bool created = false;
  bool canceled = false;
  int64_t compact_revision = 0;  // >0: the start revision was compacted away
  std::string cancel_reason;
  std::vector<Event> events;
};

// --- request bodies -------------------------------------------------------------------------

std::string encode_put(const std::string& key, const std::string& value, int64_t lease);
std::string encode_range(const std::string& key, const std::string& range_end, bool count_only);
std::string encode_delete(const std::string& key, const std::string& range_end);
std::string encode_txn(const std::vector<Compare>& compares, const std::vector<Op>& success,
                       const std::vector<Op>& failure);
std::string encode_lease_grant(int64_t ttl_seconds);
std::string encode_lease_id(int64_t id);  // keepalive, revoke, timetolive
std::string encode_watch_create(const std::string& key, const std::string& range_end,
                                int64_t start_revision);

// --- response bodies ------------------------------------------------------------------------

int64_t decode_put(const std::string& body);  // the new revision
RangeResponse decode_range(const std::string& body);
int64_t decode_delete(const std::string& body);  // keys deleted
TxnResponse decode_txn(const std::string& body);
struct LeaseGrant {
  int64_t id = 0;
  int64_t ttl = 0;
};
LeaseGrant decode_lease_grant(const std::string& body);
// The TTL left, or nullopt when the lease has expired or never existed (TTL omitted or <= 0).
// Accepts the body with or without the streaming {"result": ...} wrapper.
std::optional<int64_t> decode_lease_keepalive(const std::string& body);
// The whole seconds a lease has left (etcd truncates: 0 is less than a second, and the gateway
// omits it), or nullopt when it has expired or never existed (TTL -1).
std::optional<int64_t> decode_lease_time_to_live(const std::string& body);
// One line of a watch stream. Throws ProtocolError for {"error": ...} lines.
WatchMessage decode_watch_line(const std::string& line);

// The gRPC error of a non-200 answer: "etcdserver: requested lease not found (code 5)".
struct GatewayError {
  int code = 0;  // gRPC status code (5 NOT_FOUND, 9 FAILED_PRECONDITION, 14 UNAVAILABLE, ...)
  std::string message;
};
GatewayError decode_error(const std::string& body);

}  // namespace dlaunch::etcd
