// The gateway's JSON, encoded and decoded without a server. The answers quoted here are what
// etcd 3.4.23 (Debian 12) sent to curl for the same requests.
#include "rendezvous/etcd/etcd_codec.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlaunch::etcd {
namespace {

TEST(EtcdCodec, Base64RoundTripsEveryByte) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foob"), "Zm9vYg==");
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n = 0; n <= all.size(); n += 37) {
    EXPECT_EQ(base64_decode(base64_encode(all.substr(0, n))), all.substr(0, n));
  }
  EXPECT_EQ(base64_decode("Zm9vYg"), "foob");  // unpadded is accepted
  EXPECT_THROW(base64_decode("Zm9v!"), ProtocolError);
  EXPECT_THROW(base64_decode("Z"), ProtocolError);
  EXPECT_THROW(base64_decode("Zg==="), ProtocolError);
}

TEST(EtcdCodec, PrefixEnd) {
  EXPECT_EQ(prefix_end("/dlaunch/run1/"), "/dlaunch/run10");
  EXPECT_EQ(prefix_end("a\xff"), "b");
  EXPECT_EQ(prefix_end(std::string("\xff\xff")), std::string(1, '\0'));
  EXPECT_EQ(prefix_end(""), std::string(1, '\0'));
}

TEST(EtcdCodec, RangeFoundAndMissing) {
  auto r = decode_range(
      R"({"header":{"cluster_id":"12516063240621178528","member_id":"9858013262755744996","revision":"2","raft_term":"2"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}],"count":"1"})");
  EXPECT_EQ(r.revision, 2);
  ASSERT_EQ(r.kvs.size(), 1u);
  EXPECT_EQ(r.kvs[0].key, "foo");
  EXPECT_EQ(r.kvs[0].value, "bar");
  EXPECT_EQ(r.kvs[0].create_revision, 2);
  EXPECT_EQ(r.kvs[0].version, 1);
  EXPECT_EQ(r.count, 1);
  // A missing key: no "kvs", no "count" (defaults are omitted).
  auto missing = decode_range(
      R"({"header":{"cluster_id":"1","member_id":"2","revision":"7","raft_term":"2"}})");
  EXPECT_EQ(missing.revision, 7);
  EXPECT_TRUE(missing.kvs.empty());
  EXPECT_EQ(missing.count, 0);
  // An empty value is omitted too.
  auto empty = decode_range(
      R"({"header":{"revision":"3"},"kvs":[{"key":"Zm9v","mod_revision":"3"}],"count":"1"})");
  EXPECT_EQ(empty.kvs.at(0).value, "");
  // Numbers instead of strings are accepted.
  EXPECT_EQ(decode_range(R"({"header":{"revision":9}})").revision, 9);
}

TEST(EtcdCodec, TxnSucceededAndFailed) {
  auto ok = decode_txn(
      R"({"header":{"revision":"3"},"succeeded":true,"responses":[{"response_put":{"header":{"revision":"3"}}}]})");
  EXPECT_TRUE(ok.succeeded);
  ASSERT_EQ(ok.responses.size(), 1u);
  EXPECT_EQ(ok.responses[0].kind, Op::Kind::kPut);
  // A failed compare: no "succeeded" at all; the failure branch's range follows.
  auto failed = decode_txn(
      R"({"header":{"revision":"2"},"responses":[{"response_range":{"header":{"revision":"2"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}],"count":"1"}}]})");
  EXPECT_FALSE(failed.succeeded);
  ASSERT_EQ(failed.responses.size(), 1u);
  EXPECT_EQ(failed.responses[0].range.kvs.at(0).value, "bar");
  auto del = decode_txn(
      R"({"header":{},"succeeded":true,"responses":[{"response_delete_range":{"header":{},"deleted":"2"}}]})");
  EXPECT_EQ(del.responses.at(0).deleted, 2);
  EXPECT_THROW(decode_txn(R"({"responses":[{"response_frob":{}}]})"), ProtocolError);
}

TEST(EtcdCodec, TxnRequestShape) {
  std::string body = encode_txn({Compare::missing("k"), Compare::value_equals("v", "x"),
                                 Compare::mod_revision_equals("m", 12)},
                                {Op::put("k", "1", 77)}, {Op::get("k"), Op::del("d")});
  EXPECT_NE(body.find(R"("target":"CREATE")"), std::string::npos) << body;
  EXPECT_NE(body.find(R"("create_revision":"0")"), std::string::npos) << body;
  EXPECT_NE(body.find(R"("value":"eA==")"), std::string::npos) << body;
  EXPECT_NE(body.find(R"("mod_revision":"12")"), std::string::npos) << body;
  EXPECT_NE(body.find(R"("request_put":{"key":"aw==","lease":"77","value":"MQ=="})"),
            std::string::npos)
      << body;
  EXPECT_NE(body.find(R"("request_delete_range":{"key":"ZA=="})"), std::string::npos) << body;
  std::string prefix = encode_range("/p/", prefix_end("/p/"), true);
  EXPECT_EQ(prefix, R"({"count_only":true,"key":"L3Av","range_end":"L3Aw"})");
}

// The ledger's ranges: arrival order is create_revision order, proto enum names as strings,
// int64 fields as decimal strings; defaults (no sort, no limit) are left out.
TEST(EtcdCodec, SortedLimitedRangeOp) {
  Op sorted = Op::get_prefix("/p/");
  sorted.sort_by_create = true;
  sorted.limit = 64;
  Op upto = Op::get_prefix("/p/");
  upto.count_only = true;
  upto.max_create_revision = 41;
  std::string body = encode_txn({}, {sorted, upto, Op::get("k")}, {});
  EXPECT_NE(body.find(R"({"request_range":{"key":"L3Av","limit":"64","range_end":"L3Aw",)"
                      R"("sort_order":"ASCEND","sort_target":"CREATE"}})"),
            std::string::npos)
      << body;
  EXPECT_NE(body.find(R"({"request_range":{"count_only":true,"key":"L3Av",)"
                      R"("max_create_revision":"41","range_end":"L3Aw"}})"),
            std::string::npos)
      << body;
  EXPECT_NE(body.find(R"({"request_range":{"key":"aw=="}})"), std::string::npos) << body;
}

TEST(EtcdCodec, Leases) {
  auto g =
      decode_lease_grant(R"({"header":{"revision":"2"},"ID":"5540731580545638153","TTL":"2"})");
  EXPECT_EQ(g.id, 5540731580545638153);
  EXPECT_EQ(g.ttl, 2);
  EXPECT_THROW(decode_lease_grant(R"({"header":{}})"), ProtocolError);
  EXPECT_EQ(encode_lease_id(5540731580545638153), R"({"ID":"5540731580545638153"})");
  // Alive: the stream's one message, wrapped in "result", with the TTL.
  EXPECT_EQ(decode_lease_keepalive(
                R"({"result":{"header":{"revision":"2"},"ID":"5540731580545638153","TTL":"5"}})"),
            5);
  // Expired: 200, but no TTL.
  EXPECT_EQ(
      decode_lease_keepalive(R"({"result":{"header":{"revision":"2"},"ID":"5540731580545638153"}})"
                             "\n"),
      std::nullopt);
  EXPECT_THROW(decode_lease_keepalive(R"({"error":{"grpc_code":14,"message":"unavailable"}})"),
               ProtocolError);
  // timetolive (another agent's lease): the seconds left, 0 omitted, -1 when it is gone.
  EXPECT_EQ(decode_lease_time_to_live(
                R"({"header":{"revision":"9"},"ID":"5540731580545638153","TTL":"4","grantedTTL":"6"})"),
            4);
  EXPECT_EQ(decode_lease_time_to_live(
                R"({"header":{"revision":"9"},"ID":"5540731580545638153","grantedTTL":"6"})"),
            0);
  EXPECT_EQ(decode_lease_time_to_live(
                R"({"header":{"revision":"9"},"ID":"5540731580545638153","TTL":"-1"})"),
            std::nullopt);
}

TEST(EtcdCodec, WatchLines) {
  auto created = decode_watch_line(
      R"({"result":{"header":{"cluster_id":"1","member_id":"2","revision":"3","raft_term":"2"},"created":true}})");
  EXPECT_TRUE(created.created);
  EXPECT_TRUE(created.events.empty());
  // A PUT event has no "type" (the enum's default); DELETE is spelled out.
  auto put = decode_watch_line(
      R"({"result":{"header":{"revision":"4"},"events":[{"kv":{"key":"Zm9v","create_revision":"2","mod_revision":"4","version":"2","value":"djI="}}]}})");
  ASSERT_EQ(put.events.size(), 1u);
  EXPECT_EQ(put.events[0].type, Event::Type::kPut);
  EXPECT_EQ(put.events[0].kv.value, "v2");
  EXPECT_EQ(put.revision, 4);
  auto del = decode_watch_line(
      R"({"result":{"header":{"revision":"5"},"events":[{"type":"DELETE","kv":{"key":"Zm9v","mod_revision":"5"}}]}})");
  EXPECT_EQ(del.events.at(0).type, Event::Type::kDelete);
  EXPECT_EQ(del.events.at(0).kv.key, "foo");
  auto compacted = decode_watch_line(
      R"({"result":{"header":{},"watch_id":"0","canceled":true,"compact_revision":"3"}})");
  EXPECT_TRUE(compacted.canceled);
  EXPECT_EQ(compacted.compact_revision, 3);
  EXPECT_THROW(decode_watch_line(R"({"error":{"message":"boom"}})"), ProtocolError);
  EXPECT_THROW(decode_watch_line("not json"), ProtocolError);
  EXPECT_EQ(encode_watch_create("k", "", 5),
            R"({"create_request":{"key":"aw==","start_revision":"5"}})");
}

TEST(EtcdCodec, GatewayErrors) {
  auto e = decode_error(
      R"({"error":"etcdserver: requested lease not found","code":5,"message":"etcdserver: requested lease not found"})");
  EXPECT_EQ(e.code, 5);
  EXPECT_EQ(e.message, "etcdserver: requested lease not found");
  auto garbage = decode_error("<html>502</html>");
  EXPECT_EQ(garbage.code, 0);
  EXPECT_EQ(garbage.message, "<html>502</html>");
}

TEST(EtcdCodec, DecodersNameTheCallOnGarbage) {
  try {
    decode_range("[1,2]");
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("etcd range answer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(decode_range(R"({"kvs":{}})"), ProtocolError);
  EXPECT_THROW(decode_range(R"({"header":{"revision":"x1"}})"), ProtocolError);
}

}  // namespace
}  // namespace dlaunch::etcd
