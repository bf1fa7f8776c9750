// The wire codec against byte sequences written out by hand from PyTorch's TCPStore source
// layout (u8 opcode, u64 little-endian lengths, raw i64 for ADD), for both dialects.
#include "rendezvous/tcp/store_codec.h"

#include <gtest/gtest.h>

#include <random>
#include "tests/rendezvous/frame_bytes.h"

namespace dlaunch::wire {
namespace {

using dlaunch::test::cat;
using dlaunch::test::str;
using dlaunch::test::u32;
using dlaunch::test::u64;
using dlaunch::test::u8;

DecodeResult decode(Dialect d, const Bytes& b, Request* q, Limits limits = {}) {
  return decode_request(d, b.data(), b.size(), limits, q);
}

TEST(StoreCodec, Torch113GoldenFrames) {
  Request q;
  // SET "k" = "v"
  Bytes set = cat({u8(0), str("k"), str("v")});
  auto r = decode(Dialect::kTorch113, set, &q);
  ASSERT_EQ(r.status, Status::kOk);
  EXPECT_EQ(r.consumed, set.size());
  EXPECT_EQ(q.op, Op::kSet);
  EXPECT_EQ(q.keys[0], "k");
  EXPECT_EQ(to_string(q.values[0]), "v");
  // COMPARE_SET "k" "" "new"
  r = decode(Dialect::kTorch113, cat({u8(1), str("k"), str(""), str("new")}), &q);
  ASSERT_EQ(r.status, Status::kOk);
  EXPECT_EQ(q.op, Op::kCompareSet);
  EXPECT_TRUE(q.values[0].empty());
  EXPECT_EQ(to_string(q.values[1]), "new");
  // GET, ADD (-3 as raw i64), CHECK 2 keys, WAIT 1 key, GETNUMKEYS, WATCH_KEY, DELETE_KEY
  r = decode(Dialect::kTorch113, cat({u8(2), str("key")}), &q);
  EXPECT_EQ(q.op, Op::kGet);
  r = decode(Dialect::kTorch113, cat({u8(3), str("c"), u64(uint64_t(-3))}), &q);
  ASSERT_EQ(r.status, Status::kOk);
  EXPECT_EQ(q.op, Op::kAdd);
  EXPECT_EQ(q.delta, -3);
  r = decode(Dialect::kTorch113, cat({u8(4), u64(2), str("a"), str("bb")}), &q);
  ASSERT_EQ(r.status, Status::kOk);
  EXPECT_EQ(q.op, Op::kCheck);
  EXPECT_EQ(q.keys, (std::vector<std::string>{"a", "bb"}));
  r = decode(Dialect::kTorch113, cat({u8(5), u64(1), str("init/")}), &q);
  EXPECT_EQ(q.op, Op::kWait);
  r = decode(Dialect::kTorch113, u8(6), &q);
  ASSERT_EQ(r.status, Status::kOk);
  EXPECT_EQ(q.op, Op::kNumKeys);
  EXPECT_EQ(r.consumed, 1u);
  r = decode(Dialect::kTorch113, cat({u8(7), str("w")}), &q);
  EXPECT_EQ(q.op, Op::kWatchKey);
  r = decode(Dialect::kTorch113, cat({u8(8), str("d")}), &q);
  EXPECT_EQ(q.op, Op::kDeleteKey);
  // 9 and up do not exist in 1.13.
  EXPECT_EQ(decode(Dialect::kTorch113, cat({u8(9), str("x")}), &q).status, Status::kBad);
}

TEST(StoreCodec, Torch2GoldenFramesAreShiftedByOne) {
  Request q;
  struct Case {
    Bytes frame;
    Op op;
  };
  std::vector<Case> cases = {
      {cat({u8(0), Bytes{0xCE, 0xF7, 0x85, 0x3C}}), Op::kValidate},
      {cat({u8(1), str("k"), str("v")}), Op::kSet},
      {cat({u8(2), str("k"), str("a"), str("b")}), Op::kCompareSet},
      {cat({u8(3), str("k")}), Op::kGet},
      {cat({u8(4), str("k"), u64(7)}), Op::kAdd},
      {cat({u8(5), u64(1), str("k")}), Op::kCheck},
      {cat({u8(6), u64(1), str("k")}), Op::kWait},
      {u8(7), Op::kNumKeys},
      {cat({u8(8), str("k")}), Op::kDeleteKey},
      {cat({u8(9), str("k"), str("tail")}), Op::kAppend},
      {cat({u8(10), u64(2), str("a"), str("b")}), Op::kMultiGet},
      {cat({u8(11), u64(1), str("a"), str("1")}), Op::kMultiSet},
      {u8(12), Op::kCancelWait},
      {cat({u8(13), Bytes{1, 2, 3, 4}}), Op::kPing},
      {cat({u8(14), str("q"), str("item")}), Op::kQueuePush},
      {cat({u8(15), str("q")}), Op::kQueuePop},
      {cat({u8(16), str("q")}), Op::kQueueLen},
      // As PyTorch 2.15's client sends them (captured): LIST_KEYS alone; BARRIER with the key
      // and the world size as an i64.
      {u8(17), Op::kListKeys},
      {cat({u8(18), str("/bar2"), u64(2)}), Op::kBarrier},
  };
  for (const auto& c : cases) {
    auto r = decode(Dialect::kTorch2, c.frame, &q);
    ASSERT_EQ(r.status, Status::kOk) << op_name(c.op) << ": " << r.error;
    EXPECT_EQ(r.consumed, c.frame.size()) << op_name(c.op);
    EXPECT_EQ(q.op, c.op);
    // Our encoder writes the same bytes.
    Bytes again;
    encode_request(Dialect::kTorch2, q, again);
    EXPECT_EQ(again, c.frame) << op_name(c.op);
  }
  decode(Dialect::kTorch2, cat({u8(0), Bytes{0xCE, 0xF7, 0x85, 0x3C}}), &q);
  EXPECT_EQ(q.u32, kValidationMagic);
  decode(Dialect::kTorch2, cat({u8(13), Bytes{1, 2, 3, 4}}), &q);
  EXPECT_EQ(q.u32, 0x04030201u);
  decode(Dialect::kTorch2, cat({u8(18), str("/bar2"), u64(2)}), &q);
  EXPECT_EQ(q.delta, 2);
  auto unknown = decode(Dialect::kTorch2, u8(19), &q);
  EXPECT_EQ(unknown.status, Status::kBad);
  EXPECT_EQ(unknown.error,
            "unknown opcode 19 for the PyTorch 2.x dialect (it has 0-18, and dlaunch's 160-168): a "
            "PyTorch newer than this dlaunch knows, or a client that is no store client");
}

// dlaunch's own ops (2.x dialect only): FEATURES carries nothing; WAIT_GET a u64 timeout in ms,
// then a key list (the first is waited for).
TEST(StoreCodec, FeaturesAndWaitGetGoldenFrames) {
  Request q;
  auto r = decode(Dialect::kTorch2, u8(0xA4), &q);
  ASSERT_EQ(r.status, Status::kOk) << r.error;
  EXPECT_EQ(q.op, Op::kFeatures);
  const Bytes frame = cat({u8(0xA5), u64(1500), u64(2), str("done"), str("table")});
  r = decode(Dialect::kTorch2, frame, &q);
  ASSERT_EQ(r.status, Status::kOk) << r.error;
  EXPECT_EQ(r.consumed, frame.size());
  EXPECT_EQ(q.op, Op::kWaitGet);
  EXPECT_EQ(q.timeout_ms, 1500u);
  EXPECT_EQ(q.keys, (std::vector<std::string>{"done", "table"}));
  Bytes again;
  encode_request(Dialect::kTorch2, q, again);
  EXPECT_EQ(again, frame);
  for (size_t cut = 0; cut < frame.size(); ++cut) {
    EXPECT_EQ(decode(Dialect::kTorch2, Bytes(frame.begin(), frame.begin() + cut), &q).status,
              Status::kNeedMore)
        << cut;
  }
  // A later request of another shape does not keep the timeout.
  decode(Dialect::kTorch2, cat({u8(6), u64(1), str("k")}), &q);
  EXPECT_EQ(q.timeout_ms, 0u);
  // Not in PyTorch 1.13's dialect.
  EXPECT_EQ(decode(Dialect::kTorch113, u8(0xA4), &q).status, Status::kBad);
}

// DECLARE_RUN (2.x dialect only): the run id as a string.
TEST(StoreCodec, DeclareRunGoldenFrame) {
  Request q;
  const Bytes frame = cat({u8(0xA6), str("run-7")});
  auto r = decode(Dialect::kTorch2, frame, &q);
  ASSERT_EQ(r.status, Status::kOk) << r.error;
  EXPECT_EQ(r.consumed, frame.size());
  EXPECT_EQ(q.op, Op::kDeclareRun);
  EXPECT_EQ(q.keys, (std::vector<std::string>{"run-7"}));
  Bytes again;
  encode_request(Dialect::kTorch2, q, again);
  EXPECT_EQ(again, frame);
  EXPECT_EQ(decode(Dialect::kTorch113, u8(0xA6), &q).status, Status::kBad);
}

// The server decodes every request into one reused Request: nothing of an earlier request may
// leak into a later one, and a cut-short frame must not spoil the next decode.
TEST(StoreCodec, ReusedRequestHoldsExactlyEachNewRequest) {
  Request q;
  ASSERT_EQ(decode(Dialect::kTorch2, cat({u8(2), str("k"), str("old"), str("new")}), &q).status,
            Status::kOk);  // COMPARE_SET: one key, two values
  ASSERT_EQ(decode(Dialect::kTorch2, cat({u8(4), str("n"), u64(7)}), &q).status, Status::kOk);
  EXPECT_EQ(q.op, Op::kAdd);
  EXPECT_EQ(q.keys, std::vector<std::string>{"n"});
  EXPECT_TRUE(q.values.empty());
  EXPECT_EQ(q.delta, 7);
  // A SET cut short, then a whole GET.
  EXPECT_EQ(decode(Dialect::kTorch2, cat({u8(1), str("long-key"), u64(100)}), &q).status,
            Status::kNeedMore);
  ASSERT_EQ(decode(Dialect::kTorch2, cat({u8(3), str("g")}), &q).status, Status::kOk);
  EXPECT_EQ(q.op, Op::kGet);
  EXPECT_EQ(q.keys, std::vector<std::string>{"g"});
  EXPECT_TRUE(q.values.empty());
  EXPECT_EQ(q.delta, 0);
  ASSERT_EQ(decode(Dialect::kTorch2, cat({u8(13), u32(9)}), &q).status, Status::kOk);  // PING
  EXPECT_TRUE(q.keys.empty());
  EXPECT_EQ(q.u32, 9u);
  ASSERT_EQ(decode(Dialect::kTorch2, cat({u8(11), u64(1), str("a"), str("1")}), &q).status,
            Status::kOk);  // MULTI_SET
  EXPECT_EQ(q.u32, 0u);
  Bytes again;
  encode_request(Dialect::kTorch2, q, again);
  EXPECT_EQ(again, cat({u8(11), u64(1), str("a"), str("1")}));
}

TEST(StoreCodec, DetectsTheDialectFromTheFirstBytes) {
  Limits limits;
  Bytes v2 = cat({u8(0), Bytes{0xCE, 0xF7, 0x85, 0x3C}, u8(13)});
  auto d = detect_dialect(v2.data(), 3, limits);
  EXPECT_EQ(d.status, Status::kNeedMore);
  d = detect_dialect(v2.data(), v2.size(), limits);
  ASSERT_EQ(d.status, Status::kOk);
  EXPECT_EQ(d.dialect, Dialect::kTorch2);
  EXPECT_EQ(d.consumed, 5u);
  Bytes set113 = cat({u8(0), str("key"), str("v")});
  d = detect_dialect(set113.data(), set113.size(), limits);
  ASSERT_EQ(d.status, Status::kOk);
  EXPECT_EQ(d.dialect, Dialect::kTorch113);
  EXPECT_EQ(d.consumed, 0u);
  Bytes add113 = cat({u8(3), str("init/"), u64(1)});
  d = detect_dialect(add113.data(), 1, limits);
  EXPECT_EQ(d.dialect, Dialect::kTorch113);
  Bytes garbage = {'G', 'E', 'T', ' ', '/'};
  EXPECT_EQ(detect_dialect(garbage.data(), garbage.size(), limits).status, Status::kBad);
}

TEST(StoreCodec, EveryPrefixOfAFrameNeedsMore) {
  Bytes frame = cat({u8(11), u64(2), str("alpha"), str("1"), str("beta"), str("22")});
  Request q;
  for (size_t n = 0; n < frame.size(); ++n) {
    Bytes part(frame.begin(), frame.begin() + n);
    EXPECT_EQ(decode(Dialect::kTorch2, part, &q).status, Status::kNeedMore) << n;
  }
  auto r = decode(Dialect::kTorch2, cat({frame, u8(7)}), &q);
  ASSERT_EQ(r.status, Status::kOk);
  EXPECT_EQ(r.consumed, frame.size());  // the trailing request is left for the next call
  EXPECT_EQ(q.keys, (std::vector<std::string>{"alpha", "beta"}));
}

TEST(StoreCodec, OversizedLengthsAreBadBeforeTheBytesArrive) {
  Limits limits;
  limits.max_value_bytes = 1024;
  limits.max_key_bytes = 16;
  limits.max_keys = 4;
  Request q;
  // Only the length field has arrived, and it is already over the cap.
  EXPECT_EQ(decode(Dialect::kTorch2, cat({u8(1), str("k"), u64(1025)}), &q, limits).status,
            Status::kBad);
  EXPECT_EQ(decode(Dialect::kTorch2, cat({u8(3), u64(17)}), &q, limits).status, Status::kBad);
  EXPECT_EQ(decode(Dialect::kTorch2, cat({u8(6), u64(5)}), &q, limits).status, Status::kBad);
  EXPECT_EQ(decode(Dialect::kTorch2, cat({u8(3), u64(~0ull)}), &q, limits).status, Status::kBad);
  auto r = decode(Dialect::kTorch2, cat({u8(1), str("k"), u64(1024)}), &q, limits);
  EXPECT_EQ(r.status, Status::kNeedMore);
}

TEST(StoreCodec, RandomGarbageNeverCrashesAndNeverOverreads) {
  std::mt19937 rng(42);
  Limits limits;
  limits.max_value_bytes = 1 << 16;
  Request q;
  for (int i = 0; i < 20000; ++i) {
    Bytes b(rng() % 64);
    for (auto& x : b) x = uint8_t(rng() % 20);  // small bytes: valid opcodes and lengths
    for (auto d : {Dialect::kTorch113, Dialect::kTorch2}) {
      auto r = decode(d, b, &q, limits);
      if (r.status == Status::kOk) {
        EXPECT_LE(r.consumed, b.size());
        EXPECT_GT(r.consumed, 0u);
      }
    }
  }
}

}  // namespace
}  // namespace dlaunch::wire
