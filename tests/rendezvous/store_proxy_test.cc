// A node's store proxy (rendezvous/proxy/store_proxy.h) in front of a real store server, on
// loopback: the same bytes as the store itself for a scripted client in each dialect, the
// store's combining of grouped requests, the proxy's grouping rules, concurrent histories from
// many clients checked per key for linearizability (direct, and through the proxy with and
// without grouping), a worker leaving mid-wait, the store host's loss, the job token, and real
// PyTorch 1.13 clients.
#include "rendezvous/proxy/store_proxy.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "common/byte_order.h"
#include "common/error.h"
#include "rendezvous/proxy/request_batch.h"
#include "rendezvous/tcp/channel_frames.h"
#include "rendezvous/tcp/tcp_store_client.h"
#include "rendezvous/tcp/tcp_store_server.h"
#include "tests/rendezvous/raw_connection.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;
using wire::Op;
using wire::Request;

using Raw = test::RawConnection;

Request make(Op op, std::vector<std::string> keys = {}, std::vector<std::string> values = {},
             int64_t delta = 0) {
  Request q;
  q.op = op;
  q.keys = std::move(keys);
  for (auto& v : values) q.values.push_back(to_bytes(v));
  q.delta = delta;
  return q;
}

Bytes encode(wire::Dialect dialect, const Request& q) {
  Bytes out;
  wire::encode_request(dialect, q, out);
  return out;
}

Bytes validate() {
  Bytes out;
  wire::put_u8(out, wire::op2::kValidate);
  wire::put_u32(out, wire::kValidationMagic);
  return out;
}

// A store, and a proxy in front of it.
struct Stack {
  explicit Stack(TcpStoreServerOptions server_options = {}, bool group = true,
                 std::optional<std::string> proxy_token = std::nullopt) {
    server = std::make_unique<TcpStoreServer>(server_options);
    store_port = server->start();
    StoreProxyOptions o;
    o.store_host = "127.0.0.1";
    o.store_port = store_port;
    o.token = proxy_token;
    o.group_requests = group;
    proxy = std::make_unique<StoreProxy>(o);
    proxy_port = proxy->start();
  }
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<StoreProxy> proxy;
  uint16_t store_port = 0, proxy_port = 0;
};

// ---- the same bytes as the store itself -----------------------------------------------------

// One connection sends the script in one write and reads until the server closes it (the
// script ends with a frame the store refuses); a second connection makes the pending WAIT's
// key appear midway. Run against a fresh store, directly and through a proxy.
Bytes run_script(uint16_t port, wire::Dialect dialect) {
  Raw c(port);
  Bytes script = dialect == wire::Dialect::kTorch2 ? validate() : Bytes();
  auto add = [&](const Request& q) {
    Bytes b = encode(dialect, q);
    script.insert(script.end(), b.begin(), b.end());
  };
  add(make(Op::kSet, {"a"}, {"1"}));
  add(make(Op::kGet, {"a"}));
  add(make(Op::kAdd, {"n"}, {}, 5));
  add(make(Op::kAdd, {"n"}, {}, -7));
  add(make(Op::kCompareSet, {"c"}, {"", "x"}));
  add(make(Op::kCompareSet, {"c"}, {"no", "y"}));
  add(make(Op::kCompareSet, {"c"}, {"x", "z"}));
  add(make(Op::kCheck, {"a", "missing"}));
  add(make(Op::kWait, {"a", "n"}));
  add(make(Op::kNumKeys));
  add(make(Op::kDeleteKey, {"a"}));
  add(make(Op::kDeleteKey, {"a"}));
  add(make(Op::kWait, {"later"}));  // pending: the next requests are answered meanwhile
  add(make(Op::kGet, {"c"}));
  if (dialect == wire::Dialect::kTorch2) {
    Request ms = make(Op::kMultiSet, {"m1", "m2"}, {"v1", "v2"});
    add(ms);
    add(make(Op::kMultiGet, {"m1", "m2"}));
    add(make(Op::kAppend, {"m1"}, {"+"}));
    add(make(Op::kGet, {"m1"}));
    add(make(Op::kQueuePush, {"q"}, {"item"}));
    add(make(Op::kQueueLen, {"q"}));
    add(make(Op::kQueuePop, {"q"}));
    add(make(Op::kListKeys));
    Request ping = make(Op::kPing);
    ping.u32 = 0xDEADBEEF;
    add(ping);
  } else {
    add(make(Op::kWatchKey, {"c"}));
    add(make(Op::kSet, {"c"}, {"watched"}));
  }
  // Last, a value that ends the replies to the script, so it is known when all came.
  add(make(Op::kSet, {"marker"}, {"end-of-script"}));
  add(make(Op::kGet, {"marker"}));
  Bytes marker;
  wire::put_bytes(marker, to_bytes("end-of-script"));
  c.send(script);
  Bytes replies;
  while (replies.size() < marker.size() ||
         !std::equal(marker.begin(), marker.end(), replies.end() - marker.size())) {
    Bytes more = c.recv(1);
    if (more.empty()) return replies;  // closed or silent: the comparison will show it
    replies.insert(replies.end(), more.begin(), more.end());
  }
  // Every reply up to here came; now the key the WAIT waits for appears.
  {
    Raw other(port);
    Bytes set = dialect == wire::Dialect::kTorch2 ? validate() : Bytes();
    Bytes b = encode(dialect, make(Op::kSet, {"later"}, {"now"}));
    set.insert(set.end(), b.begin(), b.end());
    Bytes get = encode(dialect, make(Op::kGet, {"later"}));
    set.insert(set.end(), get.begin(), get.end());
    other.send(set);
    other.recv(8 + 3);
  }
  if (dialect == wire::Dialect::kTorch2) c.send(encode(dialect, make(Op::kCancelWait)));
  c.send(Bytes{0x77, 0, 0});  // an unknown opcode: the store closes the connection
  Bytes rest = c.recv_until_closed();
  replies.insert(replies.end(), rest.begin(), rest.end());
  return replies;
}

TEST(StoreProxy, EveryReplyIsByteForByteTheStoresOwnInBothDialects) {
  for (auto dialect : {wire::Dialect::kTorch113, wire::Dialect::kTorch2}) {
    SCOPED_TRACE(dialect == wire::Dialect::kTorch2 ? "2.x" : "1.13");
    TcpStoreServer direct(TcpStoreServerOptions{});
    Bytes expected = run_script(direct.start(), dialect);
    ASSERT_GT(expected.size(), 50u);
    for (bool group : {true, false}) {
      Stack stack({}, group);
      EXPECT_EQ(run_script(stack.proxy_port, dialect), expected) << "grouping " << group;
      // The store held one connection: the proxy's.
      EXPECT_EQ(stack.server->num_connections(), 1u);
    }
  }
}

// ---- the store's side of GROUP ---------------------------------------------------------------

// A connection that carries channels, spoken by hand.
class Carrier {
 public:
  explicit Carrier(uint16_t port) : raw_(port) {
    Bytes hello = validate();
    wire::put_u8(hello, wire::op2::kChannels);
    raw_.send(hello);
    EXPECT_EQ(raw_.recv(1), Bytes{0});
  }
  // Opens channels and settles each one's dialect (2.x) with a PING.
  void open(std::initializer_list<uint32_t> ids) {
    Bytes out;
    for (uint32_t id : ids) {
      wire::put_channel_open(out, id);
      Bytes first = validate();
      Request ping = make(Op::kPing);
      ping.u32 = id;
      Bytes b = encode(wire::Dialect::kTorch2, ping);
      first.insert(first.end(), b.begin(), b.end());
      wire::put_channel_data(out, id, first.data(), first.size());
    }
    raw_.send(out);
    for (size_t i = 0; i < ids.size(); ++i) next();
  }
  void data(uint32_t id, const Request& q) {
    Bytes out, b = encode(wire::Dialect::kTorch2, q);
    wire::put_channel_data(out, id, b.data(), b.size());
    raw_.send(out);
  }
  void group(const std::vector<std::pair<uint32_t, Request>>& members) {
    std::vector<Bytes> encoded;
    std::vector<wire::ChannelPayload> payloads;
    for (auto& m : members) encoded.push_back(encode(wire::Dialect::kTorch2, m.second));
    for (size_t i = 0; i < members.size(); ++i) {
      payloads.push_back({members[i].first, encoded[i].data(), encoded[i].size()});
    }
    Bytes out;
    wire::put_channel_group(out, payloads);
    raw_.send(out);
  }
  // Tells the store this carrier reads SHARED frames.
  void accept_shared() {
    Bytes out;
    wire::put_channel_shared_accepted(out);
    raw_.send(out);
  }
  // The store's next frame: (channel, payload), payload empty and `closed` for CLOSED; for
  // SHARED, every channel it names in `shared` (and the first in `channel`).
  struct Frame {
    uint32_t channel = 0;
    Bytes payload;
    bool closed = false;
    std::vector<uint32_t> shared;
  };
  Frame next() {
    Frame f;
    Bytes head = raw_.recv(5);
    EXPECT_EQ(head.size(), 5u);
    if (head.size() < 5) return f;
    f.channel = load_le<uint32_t>(head.data() + 1);
    if (head[0] == wire::kChannelClosed) {
      f.closed = true;
      return f;
    }
    if (head[0] == static_cast<uint8_t>(wire::ChannelFrameKind::kShared)) {
      Bytes ids = raw_.recv(4 * size_t{f.channel});
      for (size_t i = 0; i + 4 <= ids.size(); i += 4) f.shared.push_back(load_le<uint32_t>(ids.data() + i));
      f.channel = f.shared.empty() ? 0 : f.shared[0];
    }
    Bytes len = raw_.recv(8);
    f.payload = raw_.recv(load_le<uint64_t>(len.data()));
    return f;
  }
  Raw& raw() { return raw_; }

 private:
  Raw raw_;
};

Bytes i64(int64_t v) {
  Bytes b;
  wire::put_i64(b, v);
  return b;
}

TEST(StoreProxy, StoreAnswersAGroupOfAddsWithEachMembersOwnPrefixSum) {
  TcpStoreServer server(TcpStoreServerOptions{});
  Carrier carrier(server.start());
  carrier.open({1, 2, 3});
  carrier.data(1, make(Op::kAdd, {"n"}, {}, 10));
  EXPECT_EQ(carrier.next().payload, i64(10));
  const auto adds_before = server.stats().worker_requests_by_op["ADD"];
  carrier.group({{2, make(Op::kAdd, {"n"}, {}, 1)},
                 {1, make(Op::kAdd, {"n"}, {}, 2)},
                 {3, make(Op::kAdd, {"n"}, {}, -5)}});
  std::map<uint32_t, Bytes> got;
  for (int i = 0; i < 3; ++i) {
    auto f = carrier.next();
    got[f.channel] = f.payload;
  }
  // In the order listed: 10+1, then +2, then -5.
  EXPECT_EQ(got[2], i64(11));
  EXPECT_EQ(got[1], i64(13));
  EXPECT_EQ(got[3], i64(8));
  // One request at the store for the three.
  EXPECT_EQ(server.stats().worker_requests_by_op["ADD"], adds_before + 1);
  // A GROUP of GETs of a key set once: one look, the same value to each.
  carrier.data(1, make(Op::kSet, {"k"}, {"v"}));
  carrier.group({{1, make(Op::kGet, {"k"})}, {2, make(Op::kGet, {"k"})}, {3, make(Op::kGet, {"k"})}});
  Bytes v;
  wire::put_bytes(v, to_bytes("v"));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(carrier.next().payload, v);
  EXPECT_EQ(server.stats().worker_requests_by_op["GET"], 1);
}

Bytes values(std::initializer_list<std::string> vs) {
  Bytes b;
  for (const auto& v : vs) wire::put_bytes(b, to_bytes(v));
  return b;
}

// A combined group of reads answered with the same bytes goes down once, as one SHARED frame
// naming every member, to a carrier that said it reads them; to one that did not, as before.
TEST(StoreProxy, StoreSendsAGroupOfIdenticalReadsOnceToACarrierThatReadsShared) {
  TcpStoreServer server(TcpStoreServerOptions{});
  const uint16_t port = server.start();
  {
    Carrier carrier(port);
    carrier.accept_shared();
    carrier.open({1, 2, 3});
    carrier.data(1, make(Op::kMultiSet, {"id0", "id1"}, {"first", "second"}));
    carrier.group({{1, make(Op::kMultiGet, {"id0", "id1"})},
                   {2, make(Op::kMultiGet, {"id0", "id1"})},
                   {3, make(Op::kMultiGet, {"id0", "id1"})}});
    auto f = carrier.next();
    EXPECT_EQ(f.shared, (std::vector<uint32_t>{1, 2, 3}));
    EXPECT_EQ(f.payload, values({"first", "second"}));
    EXPECT_EQ(server.stats().worker_requests_by_op["MULTI_GET"], 1);
    // CHECKs: the same answer, whether the keys exist or not.
    carrier.group({{2, make(Op::kCheck, {"id0", "nope"})}, {3, make(Op::kCheck, {"id0", "nope"})}});
    f = carrier.next();
    EXPECT_EQ(f.shared, (std::vector<uint32_t>{2, 3}));
    EXPECT_EQ(f.payload, Bytes{wire::kCheckNotReady});
    EXPECT_EQ(server.stats().worker_requests_by_op["CHECK"], 1);
    // Replies that differ (ADDs) still go to each member on its own.
    carrier.data(1, make(Op::kAdd, {"n"}, {}, 1));
    EXPECT_EQ(carrier.next().payload, i64(1));
    carrier.group({{1, make(Op::kAdd, {"n"}, {}, 1)}, {2, make(Op::kAdd, {"n"}, {}, 1)}});
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(carrier.next().shared.empty());
  }
  {
    // A GROUP_SAME (the members' bytes once) is the GROUP it stands for.
    Carrier carrier(port);
    carrier.accept_shared();
    carrier.open({7, 8});
    Bytes q = encode(wire::Dialect::kTorch2, make(Op::kMultiGet, {"id0", "id1"}));
    Bytes out;
    wire::put_channel_group_of_same_bytes(out, {7, 8}, q.data(), q.size());
    carrier.raw().send(out);
    auto f = carrier.next();
    EXPECT_EQ(f.shared, (std::vector<uint32_t>{7, 8}));
    EXPECT_EQ(f.payload, values({"first", "second"}));
    EXPECT_EQ(server.stats().worker_requests_by_op["MULTI_GET"], 2);
  }
  Carrier older(port);  // never said SHARED: one DATA frame per member
  older.open({1, 2});
  older.group({{1, make(Op::kMultiGet, {"id0", "id1"})}, {2, make(Op::kMultiGet, {"id0", "id1"})}});
  std::set<uint32_t> answered;
  for (int i = 0; i < 2; ++i) {
    auto f = older.next();
    EXPECT_TRUE(f.shared.empty());
    EXPECT_EQ(f.payload, values({"first", "second"}));
    answered.insert(f.channel);
  }
  EXPECT_EQ(answered, (std::set<uint32_t>{1, 2}));
}

TEST(StoreProxy, StoreHandlesAGroupItCannotProveOneByOne) {
  TcpStoreServer server(TcpStoreServerOptions{});
  Carrier carrier(server.start());
  carrier.open({1, 2, 3});
  // GETs of a missing key: each channel parks on its own; one set answers all three.
  carrier.group({{1, make(Op::kGet, {"late"})}, {2, make(Op::kGet, {"late"})}, {3, make(Op::kGet, {"late"})}});
  EXPECT_TRUE(carrier.raw().silent(200));
  carrier.open({4});
  carrier.data(4, make(Op::kSet, {"late"}, {"x"}));
  Bytes x;
  wire::put_bytes(x, to_bytes("x"));
  std::set<uint32_t> answered;
  for (int i = 0; i < 3; ++i) {
    auto f = carrier.next();
    EXPECT_EQ(f.payload, x);
    answered.insert(f.channel);
  }
  EXPECT_EQ(answered, (std::set<uint32_t>{1, 2, 3}));
  // ADDs to a key that holds no counter: each fails as it would alone (its channel closed),
  // the others' channels stay.
  carrier.group({{1, make(Op::kAdd, {"late"}, {}, 1)}, {2, make(Op::kAdd, {"late"}, {}, 1)}});
  std::set<uint32_t> closed;
  for (int i = 0; i < 2; ++i) {
    auto f = carrier.next();
    EXPECT_TRUE(f.closed);
    closed.insert(f.channel);
  }
  EXPECT_EQ(closed, (std::set<uint32_t>{1, 2}));
  carrier.data(3, make(Op::kAdd, {"ok"}, {}, 4));
  auto f = carrier.next();
  EXPECT_EQ(f.channel, 3u);
  EXPECT_EQ(f.payload, i64(4));
  // The first ADD of a counter creates it: not combined, each its own value in order.
  carrier.group({{3, make(Op::kAdd, {"fresh"}, {}, 1)}, {4, make(Op::kAdd, {"fresh"}, {}, 1)}});
  std::map<uint32_t, Bytes> got;
  for (int i = 0; i < 2; ++i) {
    auto g = carrier.next();
    got[g.channel] = g.payload;
  }
  EXPECT_EQ(got[3], i64(1));
  EXPECT_EQ(got[4], i64(2));
}

TEST(StoreProxy, OnlyAProxyThatProvedTheTokenCarriesChannels) {
  TcpStoreServerOptions o;
  o.token = "secret";
  TcpStoreServer server(o);
  Raw raw(server.start());
  Bytes hello = validate();
  wire::put_u8(hello, wire::op2::kChannels);
  raw.send(hello);
  EXPECT_EQ(raw.recv(1), Bytes{wire::kDeclareRefusedNoToken});
  EXPECT_TRUE(raw.closed_by_peer());
}

// ---- the proxy's grouping rules (pure) --------------------------------------------------------

// The batch's frames, each as "KIND channel..." for reading in an assertion.
std::vector<std::string> frames_of(RequestBatch& batch) {
  Bytes out;
  int64_t grouped = 0;
  batch.encode(out, &grouped);
  std::vector<std::string> frames;
  wire::ChannelFrame f;
  size_t at = 0;
  while (at < out.size()) {
    auto r = wire::decode_channel_frame(out.data() + at, out.size() - at, wire::Limits{}, false, &f);
    EXPECT_EQ(r.status, wire::Status::kOk);
    if (r.status != wire::Status::kOk) break;
    std::string s = f.kind == wire::ChannelFrameKind::kGroup  ? "GROUP"
                    : f.kind == wire::ChannelFrameKind::kData ? "DATA"
                    : f.kind == wire::ChannelFrameKind::kOpen ? "OPEN"
                                                              : "CLOSE";
    if (f.kind == wire::ChannelFrameKind::kGroup) {
      for (auto& m : f.members) s += " " + std::to_string(m.channel);
    } else {
      s += " " + std::to_string(f.channel);
    }
    frames.push_back(s);
    at += r.consumed;
  }
  return frames;
}

void put(RequestBatch& batch, uint32_t channel, const Request& q) {
  Bytes b = encode(wire::Dialect::kTorch2, q);
  batch.request(channel, q, b.data(), b.size());
}

TEST(StoreProxyBatch, GroupsOnlyWhatKeepsEachWorkersOrderAndEachKeysOrder) {
  RequestBatch batch(true);
  put(batch, 1, make(Op::kAdd, {"n"}, {}, 1));
  put(batch, 2, make(Op::kAdd, {"n"}, {}, 1));
  put(batch, 3, make(Op::kAdd, {"n"}, {}, 1));
  EXPECT_EQ(frames_of(batch), (std::vector<std::string>{"GROUP 1 2 3"}));

  // A set of the key closes the group: a later get cannot move before the set.
  put(batch, 1, make(Op::kGet, {"k"}));
  put(batch, 2, make(Op::kSet, {"k"}, {"v"}));
  put(batch, 3, make(Op::kGet, {"k"}));
  put(batch, 4, make(Op::kGet, {"k"}));
  EXPECT_EQ(frames_of(batch), (std::vector<std::string>{"DATA 1", "DATA 2", "GROUP 3 4"}));

  // A worker's second request never joins a group before its first.
  put(batch, 1, make(Op::kGet, {"k"}));
  put(batch, 1, make(Op::kGet, {"k"}));
  put(batch, 2, make(Op::kGet, {"k"}));
  EXPECT_EQ(frames_of(batch), (std::vector<std::string>{"DATA 1", "GROUP 1 2"}));

  // Another key's requests in between do not matter; GETNUMKEYS (no keys named) is a barrier.
  put(batch, 1, make(Op::kWait, {"w"}));
  put(batch, 2, make(Op::kSet, {"other"}, {"v"}));
  put(batch, 3, make(Op::kWait, {"w"}));
  put(batch, 4, make(Op::kNumKeys));
  put(batch, 5, make(Op::kWait, {"w"}));
  EXPECT_EQ(frames_of(batch),
            (std::vector<std::string>{"GROUP 1 3", "DATA 2", "DATA 4", "DATA 5"}));

  // Different ops on one key, or different key lists, are not grouped; a channel's bytes
  // come after its OPEN and before its CLOSE.
  batch.open(9);
  put(batch, 9, make(Op::kGet, {"n"}));
  put(batch, 8, make(Op::kAdd, {"n"}, {}, 1));
  put(batch, 7, make(Op::kWait, {"n", "m"}));
  put(batch, 6, make(Op::kWait, {"n"}));
  batch.close(9);
  EXPECT_EQ(frames_of(batch), (std::vector<std::string>{"OPEN 9", "DATA 9", "DATA 8", "DATA 7",
                                                        "DATA 6", "CLOSE 9"}));
  // MULTI_GETs of the same key list, and CHECKs, group as GETs do; another list does not join.
  put(batch, 1, make(Op::kMultiGet, {"a", "b"}));
  put(batch, 2, make(Op::kMultiGet, {"a", "b"}));
  put(batch, 3, make(Op::kMultiGet, {"b", "a"}));
  put(batch, 4, make(Op::kCheck, {"c"}));
  put(batch, 5, make(Op::kCheck, {"c"}));
  EXPECT_EQ(frames_of(batch), (std::vector<std::string>{"GROUP 1 2", "DATA 3", "GROUP 4 5"}));

  // To a store that reads GROUP_SAME, members that sent the same bytes go up with them once;
  // a group whose bytes differ (ADDs of other deltas) goes up as a GROUP.
  RequestBatch same(true);
  same.send_same_bytes_once(true);
  put(same, 1, make(Op::kMultiGet, {"a", "b"}));
  put(same, 2, make(Op::kMultiGet, {"a", "b"}));
  put(same, 3, make(Op::kAdd, {"n"}, {}, 1));
  put(same, 4, make(Op::kAdd, {"n"}, {}, 2));
  Bytes wire_bytes;
  int64_t in_groups = 0;
  same.encode(wire_bytes, &in_groups);
  EXPECT_EQ(in_groups, 4);
  EXPECT_EQ(wire_bytes[0], wire::kGroupOfSameBytes);
  wire::ChannelFrame f;
  auto r = wire::decode_channel_frame(wire_bytes.data(), wire_bytes.size(), wire::Limits{}, false, &f);
  ASSERT_EQ(r.status, wire::Status::kOk);
  EXPECT_EQ(f.kind, wire::ChannelFrameKind::kGroup);
  ASSERT_EQ(f.members.size(), 2u);
  const Bytes mg = encode(wire::Dialect::kTorch2, make(Op::kMultiGet, {"a", "b"}));
  for (const auto& m : f.members) EXPECT_EQ(Bytes(m.data, m.data + m.size), mg);
  EXPECT_EQ(wire_bytes[r.consumed], static_cast<uint8_t>(wire::ChannelFrameKind::kGroup));

  RequestBatch off(false);
  put(off, 1, make(Op::kAdd, {"n"}, {}, 1));
  put(off, 2, make(Op::kAdd, {"n"}, {}, 1));
  EXPECT_EQ(frames_of(off), (std::vector<std::string>{"DATA 1", "DATA 2"}));
}

// ---- linearizability under concurrency --------------------------------------------------------

// What one client did and saw, per operation kind, for the per-key checks below.
struct History {
  std::vector<std::pair<int64_t, int64_t>> adds;  // (delta, returned) on "ctr"
  // "reg": (writer, seq) read, in this client's order; seq -1 when the key was not set yet.
  std::vector<std::pair<int, int>> reads;
  int writes = 0;                                   // seqs 0..writes-1 written to "reg"
  std::vector<std::pair<std::string, std::string>> cas_wins;  // (expected, desired) stored
  std::vector<int64_t> counter_seen;  // "ctr" as ADD returned it or GET read it, in order
  std::string error;
};

// `threads` clients run a random mix of set/get/add/compare_set/wait, then wait for each other's
// "done" keys; client t connects to ports[t % ports.size()].
std::vector<History> run_workload(std::vector<uint16_t> ports, int threads, int ops) {
  std::vector<History> histories(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      History& h = histories[t];
      try {
        TcpStoreClientOptions o;
        o.port = ports[t % ports.size()];
        o.timeout = 60s;
        TcpStoreClient c(o);
        std::mt19937 rng(1234 + t);
        std::string cas_seen;  // the latest value of "cas" this client read
        for (int i = 0; i < ops; ++i) {
          switch (rng() % 6) {
            case 0: {
              int64_t delta = 1 + rng() % 5;
              int64_t got = c.add("ctr", delta);
              h.adds.push_back({delta, got});
              h.counter_seen.push_back(got);
              break;
            }
            case 1:
              c.set("reg", to_bytes(std::to_string(t) + ":" + std::to_string(h.writes++)));
              break;
            case 2:
              if (c.check({"reg"})) {
                std::string v = to_string(c.get("reg"));
                auto colon = v.find(':');
                h.reads.push_back({std::stoi(v.substr(0, colon)), std::stoi(v.substr(colon + 1))});
              }
              break;
            case 3: {
              std::string desired = std::to_string(t) + "/" + std::to_string(i);
              std::string now = to_string(c.compare_set("cas", to_bytes(cas_seen), to_bytes(desired)));
              if (now == desired) h.cas_wins.push_back({cas_seen, desired});
              cas_seen = now;
              break;
            }
            case 4:
              if (c.check({"ctr"})) h.counter_seen.push_back(std::stoll(to_string(c.get("ctr"))));
              break;
            case 5:
              c.wait({"started"});
              break;
          }
          if (i == 0) c.set("started", to_bytes("1"));
        }
        c.set("done/" + std::to_string(t), to_bytes("1"));
        std::vector<std::string> all;
        for (int u = 0; u < threads; ++u) all.push_back("done/" + std::to_string(u));
        c.wait(all);
      } catch (const std::exception& e) {
        h.error = e.what();
      }
    });
  }
  for (auto& th : pool) th.join();
  return histories;
}

// The per-key checks: ADD's answers are the prefix sums of one order of all the adds; a
// client never reads a register value older than one it read before (each writer's values are
// in its order), nor one never written; the successful compare_sets form one chain from the
// empty value; the counter only grows, so what one client sees of it (ADD's answers, GETs)
// never goes down.
void check_linearizable(const std::vector<History>& histories, const std::string& mode) {
  SCOPED_TRACE(mode);
  std::vector<std::pair<int64_t, int64_t>> adds;  // (returned, delta)
  std::map<std::string, std::string> chain;        // expected -> desired
  size_t wins = 0;
  for (size_t t = 0; t < histories.size(); ++t) {
    const History& h = histories[t];
    ASSERT_EQ(h.error, "") << "client " << t;
    for (auto& a : h.adds) adds.push_back({a.second, a.first});
    // Register: per writer, the seqs this client read never go back; each was written.
    std::map<int, int> latest;
    for (auto& r : h.reads) {
      ASSERT_LT(r.second, histories[r.first].writes) << "client " << t << " read a value never written";
      auto it = latest.find(r.first);
      if (it != latest.end()) {
        EXPECT_GE(r.second, it->second) << "client " << t << " read back in time";
      }
      latest[r.first] = std::max(latest[r.first], r.second);
    }
    for (auto& w : h.cas_wins) {
      EXPECT_TRUE(chain.emplace(w.first, w.second).second)
          << "two compare_sets both replaced '" << w.first << "'";
      ++wins;
    }
    for (size_t i = 1; i < h.counter_seen.size(); ++i) {
      EXPECT_GE(h.counter_seen[i], h.counter_seen[i - 1]) << "client " << t << " saw the counter go down";
    }
  }
  std::sort(adds.begin(), adds.end());
  int64_t previous = 0;
  for (auto& a : adds) {
    ASSERT_EQ(a.first - a.second, previous) << "an ADD's answer is no prefix sum of one order";
    previous = a.first;
  }
  std::string at;
  size_t length = 0;
  for (auto it = chain.find(at); it != chain.end(); it = chain.find(at)) {
    at = it->second;
    ++length;
  }
  EXPECT_EQ(length, wins) << "the successful compare_sets do not form one chain";
}

TEST(StoreProxy, ConcurrentHistoriesAreLinearizablePerKeyDirectAndThroughTheProxy) {
  constexpr int kThreads = 12, kOps = 400;
  {
    TcpStoreServer direct(TcpStoreServerOptions{});
    check_linearizable(run_workload({direct.start()}, kThreads, kOps), "direct");
  }
  for (bool group : {true, false}) {
    Stack stack({}, group);
    check_linearizable(run_workload({stack.proxy_port}, kThreads, kOps),
                       group ? "proxy, grouping" : "proxy, no grouping");
    auto s = stack.proxy->stats();
    EXPECT_EQ(s.workers_accepted, kThreads);
    if (!group) {
      EXPECT_EQ(s.grouped, 0);
    }
    std::cout << "proxy (grouping " << group << "): " << s.requests << " requests, " << s.grouped
              << " of them in groups, " << s.upstream_writes << " writes to the store\n";
    EXPECT_EQ(stack.server->num_connections(), 1u);
  }
}

// Two nodes' proxies and clients of the store itself, interleaved on the same keys.
TEST(StoreProxy, HistoriesStayLinearizableAcrossTwoProxiesAndDirectClients) {
  Stack stack;
  StoreProxyOptions o;
  o.store_host = "127.0.0.1";
  o.store_port = stack.store_port;
  StoreProxy second(o);
  const uint16_t second_port = second.start();
  check_linearizable(
      run_workload({stack.proxy_port, second_port, stack.store_port}, 15, 400),
      "two proxies and direct clients");
  // The direct clients have left (the store notices soon after); the two proxies stay.
  for (int i = 0; i < 200 && stack.server->num_connections() > 2; ++i) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(stack.server->num_connections(), 2u);
}

// ---- losses -----------------------------------------------------------------------------------

// ---- reads coalesced: one request, one reply copied to each --------------------------------

// N workers on raw 2.x connections to the proxy, each with its dialect settled.
std::vector<std::unique_ptr<Raw>> workers_on(uint16_t port, int n) {
  std::vector<std::unique_ptr<Raw>> ws;
  for (int i = 0; i < n; ++i) {
    ws.push_back(std::make_unique<Raw>(port));
    Bytes hello = validate();
    Request ping = make(Op::kPing);
    ping.u32 = static_cast<uint32_t>(i);
    Bytes b = encode(wire::Dialect::kTorch2, ping);
    hello.insert(hello.end(), b.begin(), b.end());
    ws.back()->send(hello);
    EXPECT_EQ(ws.back()->recv(4).size(), 4u);
  }
  return ws;
}

// Every worker sends the same request at once: all but its last byte first, then the last
// bytes back to back, so the proxy finds them all in one read of its sockets.
void send_together(std::vector<std::unique_ptr<Raw>>& ws, const Request& q) {
  Bytes b = encode(wire::Dialect::kTorch2, q);
  Bytes head(b.begin(), b.end() - 1), tail(b.end() - 1, b.end());
  for (auto& w : ws) w->send(head);
  std::this_thread::sleep_for(50ms);
  for (auto& w : ws) w->send(tail);
}

// The scalable-init pattern: every rank of a node fetches the same ids. Sent together, the N
// MULTI_GETs are one request at the store and one reply on its socket, and each worker reads
// the ids. Rounds repeat until the proxy caught all N in one batch (it groups what arrives
// while its previous write is on the wire, so a slow thread can split them).
TEST(StoreProxy, ConcurrentIdenticalMultiGetsCostTheStoreOneRequest) {
  constexpr int kWorkers = 8;
  Stack stack;
  auto ws = workers_on(stack.proxy_port, kWorkers);
  TcpStoreClientOptions o;
  o.port = stack.store_port;
  TcpStoreClient root(o);
  bool one_request = false;
  for (int round = 0; round < 200 && !one_request; ++round) {
    const std::string p = "r" + std::to_string(round) + "/";
    root.set(p + "id0", to_bytes(std::string(128, char('a' + round % 26))));
    root.set(p + "id1", to_bytes(std::string(128, char('A' + round % 26))));
    const int64_t before = stack.server->stats().worker_requests_by_op["MULTI_GET"];
    const int64_t shared_before = stack.proxy->stats().shared_replies;
    send_together(ws, make(Op::kMultiGet, {p + "id0", p + "id1"}));
    const Bytes expected = values({std::string(128, char('a' + round % 26)),
                                   std::string(128, char('A' + round % 26))});
    for (auto& w : ws) ASSERT_EQ(w->recv(expected.size()), expected) << "round " << round;
    const int64_t requests = stack.server->stats().worker_requests_by_op["MULTI_GET"] - before;
    EXPECT_GE(requests, 1);
    EXPECT_LE(requests, kWorkers);
    if (requests == 1) {
      one_request = true;
      std::cout << "round " << round << ": " << kWorkers << " MULTI_GETs, one request\n";
      EXPECT_EQ(stack.proxy->stats().shared_replies - shared_before, kWorkers);
    }
  }
  EXPECT_TRUE(one_request) << "no round's " << kWorkers << " MULTI_GETs became one request";
  for (auto& w : ws) EXPECT_TRUE(w->silent(100)) << "a worker got more than its reply";
}

// PyTorch 1.13's clients (no VALIDATE, no MULTI_GET): their concurrent GETs of a key are one
// request and one reply too, and each reads the value in its own dialect's bytes.
TEST(StoreProxy, ConcurrentIdenticalGetsOf113ClientsCostOneRequestAndOneReply) {
  constexpr int kWorkers = 6;
  Stack stack;
  std::vector<std::unique_ptr<Raw>> ws;
  for (int i = 0; i < kWorkers; ++i) {  // a CHECK settles each one's dialect
    ws.push_back(std::make_unique<Raw>(stack.proxy_port));
    ws.back()->send(encode(wire::Dialect::kTorch113, make(Op::kCheck, {"x"})));
    EXPECT_EQ(ws.back()->recv(1), Bytes{wire::kCheckNotReady});
  }
  TcpStoreClientOptions o;
  o.port = stack.store_port;
  TcpStoreClient root(o);
  bool one_request = false;
  for (int round = 0; round < 200 && !one_request; ++round) {
    const std::string key = "uid" + std::to_string(round);
    const std::string value(128, char('a' + round % 26));
    root.set(key, to_bytes(value));
    const int64_t before = stack.server->stats().worker_requests_by_op["GET"];
    const int64_t shared_before = stack.proxy->stats().shared_replies;
    Bytes b = encode(wire::Dialect::kTorch113, make(Op::kGet, {key}));
    Bytes head(b.begin(), b.end() - 1), tail(b.end() - 1, b.end());
    for (auto& w : ws) w->send(head);
    std::this_thread::sleep_for(50ms);
    for (auto& w : ws) w->send(tail);
    for (auto& w : ws) ASSERT_EQ(w->recv(values({value}).size()), values({value})) << "round " << round;
    one_request = stack.server->stats().worker_requests_by_op["GET"] - before == 1;
    // ...and one reply, copied by the proxy to each.
    if (one_request) EXPECT_EQ(stack.proxy->stats().shared_replies - shared_before, kWorkers);
  }
  EXPECT_TRUE(one_request) << "no round's " << kWorkers << " GETs became one request";
}

// A shared reply serves only the reads it was asked for: once it came, the keys change, and
// the same MULTI_GET from each worker, alone, reads the new values.
TEST(StoreProxy, AReadAfterTheSharedReplyCameIsNotServedFromIt) {
  constexpr int kWorkers = 4;
  Stack stack;
  auto ws = workers_on(stack.proxy_port, kWorkers);
  TcpStoreClientOptions o;
  o.port = stack.store_port;
  TcpStoreClient other(o);  // another node's rank, on the store itself
  other.set("k0", to_bytes("old"));
  other.set("k1", to_bytes("old"));
  const Request q = make(Op::kMultiGet, {"k0", "k1"});
  int64_t shared = 0;
  for (int round = 0; round < 50 && shared == 0; ++round) {
    send_together(ws, q);
    for (auto& w : ws) ASSERT_EQ(w->recv(values({"old", "old"}).size()), values({"old", "old"}));
    shared = stack.proxy->stats().shared_replies;
  }
  ASSERT_GT(shared, 0) << "the proxy never shared a reply";
  other.set("k0", to_bytes("new"));
  other.set("k1", to_bytes("newer"));
  // SET has no reply: the store has taken both once it answered the next request.
  ASSERT_EQ(to_string(other.get("k1")), "newer");
  for (auto& w : ws) {
    w->send(encode(wire::Dialect::kTorch2, q));
    EXPECT_EQ(w->recv(values({"new", "newer"}).size()), values({"new", "newer"}));
  }
  // And GET, the same.
  for (auto& w : ws) {
    w->send(encode(wire::Dialect::kTorch2, make(Op::kGet, {"k1"})));
    EXPECT_EQ(w->recv(values({"newer"}).size()), values({"newer"}));
  }
}

// Single-writer registers read by many workers at once through the proxy (reads coalesced and
// their replies shared): every read returns a value no older than the last write that had
// completed when the read was sent, and no newer than the last write begun before its answer
// came. That is linearizability for a register with one writer, checked in real time (a SET,
// which has no reply, counts as done when the writer's next request is answered).
TEST(StoreProxy, CoalescedReadsAreLinearizableInRealTime) {
  constexpr int kKeys = 2, kReaders = 10, kWrites = 300;
  using Clock = std::chrono::steady_clock;
  Stack stack;
  struct Write { Clock::time_point begun, done; };
  struct Read { int key; int seq; Clock::time_point sent, answered; };
  std::vector<std::vector<Write>> writes(kKeys);
  std::vector<std::vector<Read>> reads(kReaders + kKeys);
  std::vector<std::string> errors(kReaders + kKeys);
  std::atomic<int> writers_left{kKeys};
  {
    TcpStoreClientOptions o;
    o.port = stack.proxy_port;
    TcpStoreClient c(o);
    for (int k = 0; k < kKeys; ++k) c.set("reg" + std::to_string(k), to_bytes("-1"));
  }
  auto read_all = [&](TcpStoreClient& c, std::vector<Read>& out, std::mt19937& rng) {
    const auto sent = Clock::now();
    if (rng() % 2 == 0) {
      const int k = static_cast<int>(rng() % kKeys);
      const int seq = std::stoi(to_string(c.get("reg" + std::to_string(k))));
      out.push_back({k, seq, sent, Clock::now()});
    } else {
      auto vs = c.multi_get({"reg0", "reg1"});
      const auto answered = Clock::now();
      for (int k = 0; k < kKeys; ++k) out.push_back({k, std::stoi(to_string(vs[k])), sent, answered});
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < kReaders + kKeys; ++t) {
    pool.emplace_back([&, t] {
      try {
        TcpStoreClientOptions o;
        o.port = stack.proxy_port;
        o.timeout = 60s;
        TcpStoreClient c(o);
        std::mt19937 rng(99 + t);
        if (t < kKeys) {  // the writer of reg<t>, which reads too
          for (int i = 0; i < kWrites; ++i) {
            Write w;
            w.begun = Clock::now();
            c.set("reg" + std::to_string(t), to_bytes(std::to_string(i)));
            // SET has no reply: it is done when the next request on the connection is
            // answered (the store takes a connection's requests in order).
            read_all(c, reads[t], rng);
            w.done = Clock::now();
            writes[t].push_back(w);
          }
          writers_left.fetch_sub(1);
        } else {
          while (writers_left.load() > 0) read_all(c, reads[t], rng);
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& th : pool) th.join();
  size_t checked = 0;
  for (int t = 0; t < kReaders + kKeys; ++t) {
    ASSERT_EQ(errors[t], "") << "client " << t;
    for (const Read& r : reads[t]) {
      int lowest = -1, highest = -1;
      for (int i = 0; i < static_cast<int>(writes[r.key].size()); ++i) {
        if (writes[r.key][i].done < r.sent) lowest = i;
        if (writes[r.key][i].begun < r.answered) highest = i;
      }
      ASSERT_GE(r.seq, lowest) << "client " << t << " read reg" << r.key << " older than a write "
                               << "completed before it asked";
      ASSERT_LE(r.seq, highest) << "client " << t << " read reg" << r.key << " from the future";
      ++checked;
    }
  }
  EXPECT_GT(checked, size_t{kKeys * kWrites});
  auto s = stack.proxy->stats();
  std::cout << "coalesced reads: " << checked << " values read, " << s.grouped
            << " requests in groups, " << s.shared_replies << " replies shared\n";
  EXPECT_GT(s.shared_replies, 0) << "no read was coalesced: the test proved nothing";
}

TEST(StoreProxy, AWorkerThatLeavesMidWaitDisturbsNoOther) {
  Stack stack;
  Raw a(stack.proxy_port), b(stack.proxy_port);
  Bytes wait = validate(), w = encode(wire::Dialect::kTorch2, make(Op::kWait, {"k"}));
  wait.insert(wait.end(), w.begin(), w.end());
  a.send(wait);
  b.send(wait);
  EXPECT_TRUE(b.silent(200));
  a.close();  // a worker restarts
  std::this_thread::sleep_for(100ms);
  TcpStoreClientOptions o;
  o.port = stack.proxy_port;
  TcpStoreClient setter(o);
  setter.set("k", to_bytes("v"));
  EXPECT_EQ(b.recv(1), Bytes{wire::kStopWaiting});
  // A new worker on the same node goes on as the first left off.
  Raw a2(stack.proxy_port);
  Bytes get = validate(), g = encode(wire::Dialect::kTorch2, make(Op::kGet, {"k"}));
  get.insert(get.end(), g.begin(), g.end());
  a2.send(get);
  EXPECT_EQ(a2.recv(9), (Bytes{1, 0, 0, 0, 0, 0, 0, 0, 'v'}));
  EXPECT_EQ(stack.server->num_connections(), 1u);
}

TEST(StoreProxy, StoreHostLossClosesEveryWorkerAsTheStoresOwnLossWould) {
  Stack stack;
  Raw waiting(stack.proxy_port);
  Bytes wait = validate(), w = encode(wire::Dialect::kTorch2, make(Op::kWait, {"never"}));
  wait.insert(wait.end(), w.begin(), w.end());
  waiting.send(wait);
  TcpStoreClientOptions o;
  o.port = stack.proxy_port;
  o.reconnect_timeout = 1s;
  TcpStoreClient blocked(o);
  std::atomic<int> outcome{0};
  std::thread t([&] {
    try {
      blocked.get("never-set");
    } catch (const ClosedError&) {
      outcome = 1;
    } catch (const ConnectionError&) {
      outcome = 1;
    } catch (...) {
      outcome = 2;
    }
  });
  std::this_thread::sleep_for(200ms);
  stack.server->stop();
  t.join();
  EXPECT_EQ(outcome.load(), 1);
  EXPECT_TRUE(waiting.closed_by_peer());
  EXPECT_FALSE(stack.proxy->connected());
  // Connecting again is refused, as at a dead store host.
  EXPECT_THROW(Raw again(stack.proxy_port), std::runtime_error);
}

// The proxy (its agent) goes away: its workers see their connections closed, as at the store's
// loss, and the store forgets their waits with the proxy's connection.
TEST(StoreProxy, ProxyLossClosesItsWorkersAndTheStoreForgetsThem) {
  Stack stack;
  Raw waiting(stack.proxy_port);
  Bytes get = validate(), g = encode(wire::Dialect::kTorch2, make(Op::kGet, {"never"}));
  get.insert(get.end(), g.begin(), g.end());
  waiting.send(get);
  EXPECT_TRUE(waiting.silent(200));
  EXPECT_EQ(stack.server->num_connections(), 1u);
  stack.proxy->stop();
  EXPECT_TRUE(waiting.closed_by_peer());
  for (int i = 0; i < 100 && stack.server->num_connections() > 0; ++i) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(stack.server->num_connections(), 0u);
  // The key the gone worker waited for can be set and read as usual.
  TcpStoreClientOptions o;
  o.port = stack.store_port;
  TcpStoreClient direct(o);
  direct.set("never", to_bytes("now"));
  EXPECT_EQ(to_string(direct.get("never")), "now");
}

// ---- the job token -----------------------------------------------------------------------------

TEST(StoreProxy, JobTokenIsCheckedAsTheStoreChecksIt) {
  TcpStoreServerOptions o;
  o.token = "secret";
  TcpStoreServer server(o);
  const uint16_t port = server.start();
  auto proxy_with = [&](std::optional<std::string> token) {
    StoreProxyOptions p;
    p.store_host = "127.0.0.1";
    p.store_port = port;
    p.token = token;
    p.connect_timeout = 5s;
    return std::make_unique<StoreProxy>(p);
  };
  try {
    proxy_with(std::nullopt)->start();
    ADD_FAILURE() << "a proxy without the token started";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("DLAUNCH_JOB_TOKEN"), std::string::npos) << e.what();
  }
  EXPECT_THROW(proxy_with("wrong")->start(), StateError);
  auto proxy = proxy_with("secret");
  const uint16_t proxy_port = proxy->start();
  // A PyTorch worker cannot prove the token: admitted from the proxy's host, as it is when it
  // connects directly from an agent's host.
  Raw worker(proxy_port);
  Bytes ping = validate(), p = encode(wire::Dialect::kTorch2, make(Op::kAdd, {"n"}, {}, 3));
  ping.insert(ping.end(), p.begin(), p.end());
  worker.send(ping);
  EXPECT_EQ(worker.recv(8), i64(3));
  // dtrain's workers prove it through the proxy; a wrong token is refused by the store.
  TcpStoreClientOptions c;
  c.port = proxy_port;
  c.token = "secret";
  TcpStoreClient good(c);
  EXPECT_EQ(good.add("n", 1), 4);
  c.token = "wrong";
  c.connect_timeout = 2s;
  EXPECT_ANY_THROW(TcpStoreClient bad(c));

  // A store that admits no unauthenticated client refuses the worker through the proxy too.
  o.admit_unauthenticated_from_agent_hosts = false;
  TcpStoreServer strict(o);
  StoreProxyOptions sp;
  sp.store_host = "127.0.0.1";
  sp.store_port = strict.start();
  sp.token = "secret";
  StoreProxy strict_proxy(sp);
  Raw refused(strict_proxy.start());
  refused.send(ping);
  EXPECT_TRUE(refused.closed_by_peer());
}

TEST(StoreProxy, AStoreWithoutChannelsIsAClearError) {
  TcpStoreServerOptions o;
  o.knows_features = false;
  TcpStoreServer older(o);
  StoreProxyOptions p;
  p.store_host = "127.0.0.1";
  p.store_port = older.start();
  StoreProxy proxy(p);
  try {
    proxy.start();
    FAIL() << "started against a store without channels";
  } catch (const StateError& e) {
    EXPECT_NE(std::string(e.what()).find("--store_proxy off"), std::string::npos) << e.what();
  }
}

// ---- a real PyTorch 1.13 client ------------------------------------------------------------------

TEST(StoreProxy, RealPytorch113ClientThroughTheProxy) {
  if (std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 has no torch (apt-get install python3-torch)";
  }
  Stack stack;
  std::string script = R"PY(
import sys, datetime, threading
import torch.distributed as d
T = datetime.timedelta
port = int(sys.argv[1])
s = d.TCPStore("127.0.0.1", port, 2, False, T(seconds=20))
w = d.TCPStore("127.0.0.1", port, 2, False, T(seconds=20))
s.set("from_torch", "42")
assert s.get("from_torch") == b"42"
assert s.add("ctr", 3) == 3 and w.add("ctr", 4) == 7
assert s.compare_set("cas", "", "first") == b"first"
assert w.compare_set("cas", "nope", "x") == b"first"
t = threading.Thread(target=lambda: w.wait(["later"]))
t.start()
s.set("later", "now")
t.join(10)
assert not t.is_alive()
assert s.num_keys() >= 4
assert s.delete_key("cas") and not s.delete_key("cas")
s.set_timeout(T(milliseconds=300))
try:
    s.get("absent")
    sys.exit("get of a missing key did not time out")
except RuntimeError:
    pass
print("torch-ok")
)PY";
  std::string path = ::testing::TempDir() + "/torch_proxy_client.py";
  std::ofstream(path) << script;
  std::string cmd = "/usr/bin/python3 " + path + " " + std::to_string(stack.proxy_port) + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  EXPECT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("torch-ok"), std::string::npos) << out;
  TcpStoreClientOptions o;
  o.port = stack.store_port;
  TcpStoreClient direct(o);
  EXPECT_EQ(to_string(direct.get("/from_torch")), "42");
  EXPECT_EQ(direct.add("/ctr", 0), 7);
}

}  // namespace
}  // namespace dlaunch
