#include "rendezvous/etcd/etcd_codec.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace dlaunch::etcd {
namespace {

using nlohmann::json;

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string excerpt(const std::string& body) {
  return body.size() <= 200 ? body : body.substr(0, 200) + "...";
}

[[noreturn]] void bad(const char* call, const std::string& body, const std::string& why) {
  throw ProtocolError(fmt::format("etcd {} answer is not what the v3 gateway sends ({}): {}", call,
                                  why, excerpt(body)));
}

json parse(const char* call, const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) bad(call, body, "not a JSON object");
  return j;
}

// int64 fields arrive as strings ("42"); accept numbers too. Missing means 0.
int64_t int_field(const json& j, const char* name, const char* call) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    try {
      size_t used = 0;
      int64_t v = std::stoll(s, &used);
      if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
  }
  bad(call, j.dump(), fmt::format("field '{}' is not an integer", name));
}

std::string bytes_field(const json& j, const char* name, const char* call) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return "";
  if (!it->is_string()) bad(call, j.dump(), fmt::format("field '{}' is not a string", name));
  return base64_decode(it->get_ref<const std::string&>());
}

bool bool_field(const json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

int64_t header_revision(const json& j, const char* call) {
  auto it = j.find("header");
  if (it == j.end() || !it->is_object()) return 0;
  return int_field(*it, "revision", call);
}

KeyValue decode_kv(const json& j, const char* call) {
  KeyValue kv;
  kv.key = bytes_field(j, "key", call);
  kv.value = bytes_field(j, "value", call);
  kv.create_revision = int_field(j, "create_revision", call);
  kv.mod_revision = int_field(j, "mod_revision", call);
  kv.version = int_field(j, "version", call);
  kv.lease = int_field(j, "lease", call);
  return kv;
}

RangeResponse decode_range_json(const json& j, const char* call) {
  RangeResponse r;
  r.revision = header_revision(j, call);
  if (auto it = j.find("kvs"); it != j.end()) {
    if (!it->is_array()) bad(call, j.dump(), "'kvs' is not an array");
    for (const auto& kv : *it) r.kvs.push_back(decode_kv(kv, call));
  }
  r.count = int_field(j, "count", call);
  return r;
}

// Streaming answers wrap each message in {"result": ...}; errors in {"error": ...}.
const json& unwrap(const json& j, const char* call, const std::string& body) {
  if (auto it = j.find("error"); it != j.end()) {
    std::string message = it->is_object() && it->contains("message") && (*it)["message"].is_string()
                              ? (*it)["message"].get<std::string>()
                              : it->dump();
    throw ProtocolError(fmt::format("etcd {} stream reported an error: {}", call, message));
  }
  if (auto it = j.find("result"); it != j.end()) {
    if (!it->is_object()) bad(call, body, "'result' is not an object");
    return *it;
  }
  return j;
}

json op_json(const Op& op) {
  switch (op.kind) {
    case Op::Kind::kPut: {
      json put = {{"key", base64_encode(op.key)}, {"value", base64_encode(op.value)}};
      if (op.lease != 0) put["lease"] = std::to_string(op.lease);
      return {{"request_put", put}};
    }
    case Op::Kind::kRange: {
      json range = {{"key", base64_encode(op.key)}};
      if (!op.range_end.empty()) range["range_end"] = base64_encode(op.range_end);
      if (op.count_only) range["count_only"] = true;
      if (op.sort_by_create) {
        range["sort_order"] = "ASCEND";
        range["sort_target"] = "CREATE";
      }
      if (op.limit > 0) range["limit"] = std::to_string(op.limit);
      if (op.max_create_revision > 0) {
        range["max_create_revision"] = std::to_string(op.max_create_revision);
      }
      return {{"request_range", range}};
    }
    case Op::Kind::kDelete: {
      json del = {{"key", base64_encode(op.key)}};
      if (!op.range_end.empty()) del["range_end"] = base64_encode(op.range_end);
      return {{"request_delete_range", del}};
    }
  }
  DL_CHECK(false) << "unknown op kind " << static_cast<int>(op.kind);
  return {};
}

const char* target_name(Compare::Target t) {
  switch (t) {
    case Compare::Target::kVersion:
      return "VERSION";
    case Compare::Target::kCreate:
      return "CREATE";
    case Compare::Target::kMod:
      return "MOD";
    case Compare::Target::kValue:
      return "VALUE";
    case Compare::Target::kLease:
      return "LEASE";
  }
  return "VALUE";
}

const char* result_name(Compare::Result r) {
  switch (r) {
    case Compare::Result::kEqual:
      return "EQUAL";
    case Compare::Result::kGreater:
      return "GREATER";
    case Compare::Result::kLess:
      return "LESS";
    case Compare::Result::kNotEqual:
      return "NOT_EQUAL";
  }
  return "EQUAL";
}

json compare_json(const Compare& c) {
  json j = {{"key", base64_encode(c.key)},
            {"target", target_name(c.target)},
            {"result", result_name(c.result)}};
  switch (c.target) {
    case Compare::Target::kVersion:
      j["version"] = std::to_string(c.number);
      break;
    case Compare::Target::kCreate:
      j["create_revision"] = std::to_string(c.number);
      break;
    case Compare::Target::kMod:
      j["mod_revision"] = std::to_string(c.number);
      break;
    case Compare::Target::kLease:
      j["lease"] = std::to_string(c.number);
      break;
    case Compare::Target::kValue:
      j["value"] = base64_encode(c.value);
      break;
  }
  return j;
}

}  // namespace

std::string base64_encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t n = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) |
                 uint8_t(bytes[i + 2]);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += kAlphabet[n & 63];
  }
  size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t n = uint32_t(uint8_t(bytes[i])) << 16;
    if (rest == 2) n |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += rest == 2 ? kAlphabet[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64_decode(const std::string& text) {
  auto value = [&](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;  // '-' and '_': the URL-safe alphabet
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string clean = text;
  while (!clean.empty() && clean.back() == '=') clean.pop_back();
  if (text.size() - clean.size() > 2 || clean.size() % 4 == 1) {
    throw ProtocolError(fmt::format("'{}' is not base64 (bad length or padding)", excerpt(text)));
  }
  std::string out;
  out.reserve(clean.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : clean) {
    int v = value(c);
    if (v < 0) throw ProtocolError(fmt::format("'{}' is not base64 ('{}')", excerpt(text), c));
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<uint8_t>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

Compare Compare::value_equals(std::string key, std::string value) {
  Compare c;
  c.key = std::move(key);
  c.target = Target::kValue;
  c.value = std::move(value);
  return c;
}

Compare Compare::missing(std::string key) {
  Compare c;
  c.key = std::move(key);
  c.target = Target::kCreate;
  c.number = 0;
  return c;
}

Compare Compare::mod_revision_equals(std::string key, int64_t revision) {
  Compare c;
  c.key = std::move(key);
  c.target = Target::kMod;
  c.number = revision;
  return c;
}

Op Op::put(std::string key, std::string value, int64_t lease) {
  Op op;
  op.kind = Kind::kPut;
  op.key = std::move(key);
  op.value = std::move(value);
  op.lease = lease;
  return op;
}

Op Op::get(std::string key) {
  Op op;
  op.kind = Kind::kRange;
  op.key = std::move(key);
  return op;
}

Op Op::get_prefix(std::string prefix) {
  Op op;
  op.kind = Kind::kRange;
  op.range_end = prefix_end(prefix);
  op.key = std::move(prefix);
  return op;
}

Op Op::del(std::string key) {
  Op op;
  op.kind = Kind::kDelete;
  op.key = std::move(key);
  return op;
}

std::string encode_put(const std::string& key, const std::string& value, int64_t lease) {
  json j = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) j["lease"] = std::to_string(lease);
  return j.dump();
}

std::string encode_range(const std::string& key, const std::string& range_end, bool count_only) {
  json j = {{"key", base64_encode(key)}};
  if (!range_end.empty()) j["range_end"] = base64_encode(range_end);
  if (count_only) j["count_only"] = true;
  return j.dump();
}

std::string encode_delete(const std::string& key, const std::string& range_end) {
  json j = {{"key", base64_encode(key)}};
  if (!range_end.empty()) j["range_end"] = base64_encode(range_end);
  return j.dump();
}

std::string encode_txn(const std::vector<Compare>& compares, const std::vector<Op>& success,
                       const std::vector<Op>& failure) {
  json j = json::object();
  json c = json::array();
  for (const auto& x : compares) c.push_back(compare_json(x));
  json s = json::array();
  for (const auto& x : success) s.push_back(op_json(x));
  json f = json::array();
  for (const auto& x : failure) f.push_back(op_json(x));
  j["compare"] = c;
  j["success"] = s;
  j["failure"] = f;
  return j.dump();
}

std::string encode_lease_grant(int64_t ttl_seconds) {
  return json{{"TTL", std::to_string(ttl_seconds)}}.dump();
}

std::string encode_lease_id(int64_t id) {
  return json{{"ID", std::to_string(id)}}.dump();
}

std::string encode_watch_create(const std::string& key, const std::string& range_end,
                                int64_t start_revision) {
  json req = {{"key", base64_encode(key)}};
  if (!range_end.empty()) req["range_end"] = base64_encode(range_end);
  if (start_revision > 0) req["start_revision"] = std::to_string(start_revision);
  return json{{"create_request", req}}.dump();
}

int64_t decode_put(const std::string& body) {
  return header_revision(parse("put", body), "put");
}

RangeResponse decode_range(const std::string& body) {
  return decode_range_json(parse("range", body), "range");
}

int64_t decode_delete(const std::string& body) {
  return int_field(parse("deleterange", body), "deleted", "deleterange");
}

TxnResponse decode_txn(const std::string& body) {
  json j = parse("txn", body);
  TxnResponse t;
  t.revision = header_revision(j, "txn");
  t.succeeded = bool_field(j, "succeeded");  // omitted when false
  if (auto it = j.find("responses"); it != j.end()) {
    if (!it->is_array()) bad("txn", body, "'responses' is not an array");
    for (const auto& r : *it) {
      OpResponse op;
      if (auto range = r.find("response_range"); range != r.end()) {
        op.kind = Op::Kind::kRange;
        op.range = decode_range_json(*range, "txn");
      } else if (auto del = r.find("response_delete_range"); del != r.end()) {
        op.kind = Op::Kind::kDelete;
        op.deleted = int_field(*del, "deleted", "txn");
      } else if (r.contains("response_put")) {
        op.kind = Op::Kind::kPut;
      } else {
        bad("txn", body, "a response is neither put, range nor delete");
      }
      t.responses.push_back(std::move(op));
    }
  }
  return t;
}

LeaseGrant decode_lease_grant(const std::string& body) {
  json j = parse("lease grant", body);
  LeaseGrant g;
  g.id = int_field(j, "ID", "lease grant");
  g.ttl = int_field(j, "TTL", "lease grant");
  if (g.id == 0 || g.ttl <= 0) {
    std::string why = j.contains("error") ? j["error"].dump() : "no ID or TTL";
    bad("lease grant", body, why);
  }
  return g;
}

std::optional<int64_t> decode_lease_keepalive(const std::string& body) {
  // A streamed answer: one line per message; the first one answers our single request.
  std::string line = body.substr(0, body.find('\n'));
  json j = parse("lease keepalive", line);
  const json& r = unwrap(j, "lease keepalive", line);
  int64_t ttl = int_field(r, "TTL", "lease keepalive");  // omitted: expired or unknown
  if (ttl <= 0) return std::nullopt;
  return ttl;
}

std::optional<int64_t> decode_lease_time_to_live(const std::string& body) {
  json j = parse("lease timetolive", body);
  const json& r = unwrap(j, "lease timetolive", body);
  int64_t ttl = int_field(r, "TTL", "lease timetolive");  // -1: expired or unknown
  if (ttl < 0) return std::nullopt;
  return ttl;
}

WatchMessage decode_watch_line(const std::string& line) {
  json j = parse("watch", line);
  const json& r = unwrap(j, "watch", line);
  WatchMessage m;
  m.revision = header_revision(r, "watch");
  m.watch_id = int_field(r, "watch_id", "watch");
  m.created = bool_field(r, "created");
  m.canceled = bool_field(r, "canceled");
  m.compact_revision = int_field(r, "compact_revision", "watch");
  if (auto it = r.find("cancel_reason"); it != r.end() && it->is_string()) {
    m.cancel_reason = it->get<std::string>();
  }
  if (auto it = r.find("events"); it != r.end()) {
    if (!it->is_array()) bad("watch", line, "'events' is not an array");
    for (const auto& e : *it) {
      Event ev;
      // PUT is the enum's zero value, so it is omitted; only DELETE is spelled out.
      auto type = e.find("type");
      ev.type = type != e.end() && type->is_string() && type->get<std::string>() == "DELETE"
                    ? Event::Type::kDelete
                    : Event::Type::kPut;
      if (auto kv = e.find("kv"); kv != e.end()) ev.kv = decode_kv(*kv, "watch");
      m.events.push_back(std::move(ev));
    }
  }
  return m;
}

GatewayError decode_error(const std::string& body) {
  GatewayError e;
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    e.message = excerpt(body);
    return e;
  }
  const json& x = j.contains("error") && j["error"].is_object() ? j["error"] : j;
  if (auto it = x.find("code"); it != x.end() && it->is_number_integer()) e.code = it->get<int>();
  if (auto it = x.find("message"); it != x.end() && it->is_string()) {
    e.message = it->get<std::string>();
  } else if (auto it2 = x.find("error"); it2 != x.end() && it2->is_string()) {
    e.message = it2->get<std::string>();
  } else {
    e.message = excerpt(body);
  }
  return e;
}

}  // namespace dlaunch::etcd
