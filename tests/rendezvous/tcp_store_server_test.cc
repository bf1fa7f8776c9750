// The TCP store server on loopback: raw clients speaking each PyTorch dialect byte by byte,
// malformed frames, thousands of connections, the job token, binding rules, and a real
// PyTorch 1.13 client.
#include "rendezvous/tcp/tcp_store_server.h"
#include "rendezvous/tcp/worker_namespace.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <thread>

#include "common/byte_order.h"
#include "rendezvous/store/in_memory_store.h"
#include "rendezvous/store/prefix_store.h"
#include "rendezvous/tcp/tcp_store_client.h"
#include "tests/rendezvous/raw_connection.h"
#include "tests/rendezvous/frame_bytes.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

using Raw = test::RawConnection;

using test::cat;
using test::str;
using test::u32;
using test::u64;
using test::u8;
using test::kValidate;

class ServerTest : public ::testing::Test {
 protected:
  void start(TcpStoreServerOptions o = {}) {
    server_ = std::make_unique<TcpStoreServer>(o);
    port_ = server_->start();
  }
  std::shared_ptr<TcpStoreClient> client(std::optional<std::string> token = std::nullopt,
                                         Duration connect_timeout = 5s, bool agent = false) {
    TcpStoreClientOptions o;
    o.port = port_;
    o.connect_timeout = connect_timeout;
    o.timeout = 5s;
    o.token = token;
    o.agent = agent;
    return std::make_shared<TcpStoreClient>(o);
  }
  std::unique_ptr<TcpStoreServer> server_;
  uint16_t port_ = 0;
};

TEST_F(ServerTest, SpeaksTorch113ByteForByte) {
  start();
  Raw c(port_);
  c.send(cat({u8(0), str("k"), str("v")}));  // SET: no reply
  c.send(cat({u8(2), str("k")}));             // GET
  EXPECT_EQ(c.recv(9), cat({str("v")}));
  c.send(cat({u8(3), str("n"), u64(uint64_t(-4))}));  // ADD -4
  EXPECT_EQ(c.recv(8), u64(uint64_t(-4)));
  c.send(cat({u8(4), u64(2), str("k"), str("n")}));  // CHECK -> READY
  EXPECT_EQ(c.recv(1), u8(0));
  c.send(cat({u8(4), u64(1), str("absent")}));  // CHECK -> NOT_READY
  EXPECT_EQ(c.recv(1), u8(1));
  c.send(cat({u8(5), u64(1), str("k")}));  // WAIT on a present key -> STOP_WAITING
  EXPECT_EQ(c.recv(1), u8(0));
  c.send(cat({u8(1), str("k"), str("v"), str("w")}));  // COMPARE_SET match
  EXPECT_EQ(c.recv(9), str("w"));
  c.send(u8(6));  // GETNUMKEYS
  EXPECT_EQ(c.recv(8), u64(2));
  c.send(cat({u8(8), str("n")}));  // DELETE_KEY
  EXPECT_EQ(c.recv(8), u64(1));
  // WATCH_KEY: registered, then told about a change made by another client.
  Raw w(port_);
  w.send(cat({u8(7), str("k")}));
  EXPECT_EQ(w.recv(1), u8(3));
  c.send(cat({u8(0), str("k"), str("z")}));
  EXPECT_EQ(w.recv(1 + 9 + 9 + 9), cat({u8(0), str("k"), str("w"), str("z")}));
}

TEST_F(ServerTest, Torch113WaitIsParkedUntilAnotherClientSets) {
  start();
  Raw waiter(port_), setter(port_);
  waiter.send(cat({u8(5), u64(2), str("a"), str("b")}));
  EXPECT_TRUE(waiter.silent(100));
  setter.send(cat({u8(0), str("a"), str("1")}));
  EXPECT_TRUE(waiter.silent(100));
  setter.send(cat({u8(3), str("b"), u64(1)}));
  EXPECT_EQ(setter.recv(8), u64(1));
  EXPECT_EQ(waiter.recv(1), u8(0));
}

// Requests a client sent behind a parked GET (dlaunch's: a GET on a missing key waits for it)
// are answered in order once the GET is; the wake-up must not skip them.
TEST_F(ServerTest, RequestsBehindAParkedGetAreAnsweredWhenItEnds) {
  start();
  Raw getter(port_), setter(port_);
  setter.send(cat({u8(0), str("k"), str("v")}));
  setter.send(cat({u8(2), str("k")}));  // GET, so the SET is known to be done
  EXPECT_EQ(setter.recv(9), str("v"));
  getter.send(cat({u8(2), str("a"), u8(2), str("k")}));  // GET a, GET k: one write
  EXPECT_TRUE(getter.silent(100));
  getter.send(cat({u8(2), str("k")}));  // arrives while the GET is parked
  EXPECT_TRUE(getter.silent(100));
  setter.send(cat({u8(0), str("a"), str("1")}));
  EXPECT_EQ(getter.recv(9 + 9 + 9), cat({str("1"), str("v"), str("v")}));
  // And a lone GET (nothing behind it) goes on to serve what comes after it.
  getter.send(cat({u8(2), str("b")}));
  EXPECT_TRUE(getter.silent(100));
  setter.send(cat({u8(0), str("b"), str("2")}));
  EXPECT_EQ(getter.recv(9), str("2"));
  getter.send(cat({u8(6)}));  // GETNUMKEYS
  EXPECT_EQ(getter.recv(8), u64(3));
}

// A PyTorch 1.13 client times a WAIT out on its own (SO_RCVTIMEO) and has no cancel: it goes
// on using the connection. As PyTorch's server does, ours answers its next requests at once and
// sends the STOP_WAITING still due when the keys appear; a reply to the request that made them
// appear comes before it.
TEST_F(ServerTest, Torch113PendingWaitDoesNotHoldUpTheConnection) {
  start();
  Raw c(port_), other(port_);
  c.send(cat({u8(5), u64(1), str("a")}));  // WAIT a: times out on the client
  EXPECT_TRUE(c.silent(100));
  c.send(cat({u8(0), str("k"), str("v")}));  // SET
  c.send(cat({u8(2), str("k")}));             // GET
  EXPECT_EQ(c.recv(9), str("v"));
  c.send(u8(6));  // GETNUMKEYS
  EXPECT_EQ(c.recv(8), u64(1));
  c.send(cat({u8(8), str("k")}));  // DELETE_KEY
  EXPECT_EQ(c.recv(8), u64(1));
  c.send(cat({u8(4), u64(1), str("a")}));  // CHECK
  EXPECT_EQ(c.recv(1), u8(1));
  other.send(cat({u8(0), str("a"), str("1")}));
  EXPECT_EQ(c.recv(1), u8(0));  // the late STOP_WAITING
  EXPECT_TRUE(c.silent(100));
  // A WAIT that must wait replaces the pending one: one STOP_WAITING, for the latest's keys.
  c.send(cat({u8(5), u64(1), str("x")}));
  c.send(cat({u8(5), u64(1), str("y")}));
  EXPECT_TRUE(c.silent(100));
  other.send(cat({u8(0), str("x"), str("1")}));
  EXPECT_TRUE(c.silent(200));
  other.send(cat({u8(0), str("y"), str("1")}));
  EXPECT_EQ(c.recv(1), u8(0));
  // Its own ADD completes its pending WAIT: ADD's value first, then STOP_WAITING.
  c.send(cat({u8(5), u64(1), str("n")}));
  EXPECT_TRUE(c.silent(100));
  c.send(cat({u8(3), str("n"), u64(5)}));
  EXPECT_EQ(c.recv(8 + 1), cat({u64(5), u8(0)}));
  EXPECT_TRUE(c.silent(100));
}

TEST_F(ServerTest, SpeaksTorch2ByteForByte) {
  start();
  Raw c(port_);
  c.send(cat({kValidate, u8(13), u32(0xDEADBEEF)}));  // VALIDATE, PING
  EXPECT_EQ(c.recv(4), u32(0xDEADBEEF));
  c.send(cat({u8(1), str("k"), str("ab")}));  // SET
  c.send(cat({u8(9), str("k"), str("cd")}));  // APPEND
  c.send(cat({u8(3), str("k")}));             // GET
  EXPECT_EQ(c.recv(12), str("abcd"));
  c.send(cat({u8(11), u64(2), str("x"), str("1"), str("y"), str("22")}));  // MULTI_SET
  c.send(cat({u8(10), u64(2), str("y"), str("x")}));                      // MULTI_GET
  EXPECT_EQ(c.recv(8 + 2 + 8 + 1), cat({str("22"), str("1")}));
  c.send(cat({u8(4), str("cnt"), u64(5)}));  // ADD
  EXPECT_EQ(c.recv(8), u64(5));
  c.send(u8(7));  // GETNUMKEYS
  EXPECT_EQ(c.recv(8), u64(4));
  // Queue: push two, pop one (size before pop, then the value), length.
  c.send(cat({u8(14), str("q"), str("first")}));
  c.send(cat({u8(14), str("q"), str("second")}));
  c.send(cat({u8(16), str("q")}));
  EXPECT_EQ(c.recv(8), u64(2));
  c.send(cat({u8(15), str("q")}));
  EXPECT_EQ(c.recv(8 + 8 + 5), cat({u64(2), str("first")}));
  // WAIT parked, then CANCEL_WAIT -> WAIT_CANCELED, and the connection goes on.
  c.send(cat({u8(6), u64(1), str("never")}));
  EXPECT_TRUE(c.silent(100));
  c.send(u8(12));
  EXPECT_EQ(c.recv(1), u8(1));
  c.send(cat({u8(13), u32(7)}));
  EXPECT_EQ(c.recv(4), u32(7));
}

// PyTorch 2.x's client (TCPStore::doWait) sends WAIT, and when its timeout passes with no
// answer, CANCEL_WAIT; it then reads WAIT_CANCELED, or STOP_WAITING and WAIT_CANCELED when the
// keys came just before the cancel, and goes on with the connection. Its get() is the same
// WAIT before a GET. The frames as its SendBuffer writes them: the opcode, then for WAIT the
// key count (u64) and each key (u64 length, bytes); CANCEL_WAIT is the opcode alone.
TEST_F(ServerTest, Torch2CancelWaitEndsThePendingWaitAndTheConnectionGoesOn) {
  start();
  Raw c(port_), other(port_);
  c.send(kValidate);
  other.send(kValidate);
  const Bytes kWaitNever = cat({u8(6), u64(1), str("/never")});
  const Bytes kCancelWait = u8(12);
  c.send(kWaitNever);
  EXPECT_TRUE(c.silent(100));
  c.send(kCancelWait);
  EXPECT_EQ(c.recv(1), u8(1));  // WAIT_CANCELED
  // The cancelled wait is forgotten: its key appearing sends nothing.
  other.send(cat({u8(1), str("/never"), str("late")}));
  other.send(cat({u8(3), str("/never")}));  // GET, so the SET is known to be done
  EXPECT_EQ(other.recv(12), str("late"));
  EXPECT_TRUE(c.silent(200));
  // The connection goes on: set, get, num_keys, delete_key.
  c.send(cat({u8(1), str("/k"), str("v")}));
  c.send(cat({u8(3), str("/k")}));
  EXPECT_EQ(c.recv(9), str("v"));
  c.send(u8(7));
  EXPECT_EQ(c.recv(8), u64(2));
  c.send(cat({u8(8), str("/k")}));
  EXPECT_EQ(c.recv(8), u64(1));
  // The keys come just before the cancel: STOP_WAITING, then WAIT_CANCELED.
  c.send(cat({u8(6), u64(2), str("/a"), str("/b")}));
  EXPECT_TRUE(c.silent(100));
  other.send(cat({u8(11), u64(2), str("/a"), str("1"), str("/b"), str("2")}));  // MULTI_SET
  EXPECT_EQ(c.recv(1), u8(0));
  c.send(kCancelWait);
  EXPECT_EQ(c.recv(1), u8(1));
  // As PyTorch's server, a request sent while a WAIT is pending is answered at once, and
  // CANCEL_WAIT with nothing waiting is answered WAIT_CANCELED.
  c.send(cat({u8(6), u64(1), str("/gone")}));
  c.send(cat({u8(6), u64(1), str("/other")}));  // replaces the pending one
  c.send(u8(7));
  EXPECT_EQ(c.recv(8), u64(3));
  c.send(kCancelWait);
  EXPECT_EQ(c.recv(1), u8(1));
  c.send(kCancelWait);
  EXPECT_EQ(c.recv(1), u8(1));
  other.send(cat({u8(1), str("/other"), str("x")}));
  EXPECT_TRUE(c.silent(200));
  c.send(cat({u8(13), u32(7)}));  // PING
  EXPECT_EQ(c.recv(4), u32(7));
}

// PyTorch 2.15's LIST_KEYS and BARRIER, byte for byte as its client sends them: LIST_KEYS
// answers an i64 count and the keys (not the queues); BARRIER adds 1 to the key's counter and
// answers STOP_WAITING once it reaches the world size, to every client waiting on it; a timed-out
// one is cancelled with CANCEL_WAIT (its arrival still counts) and the connection goes on.
TEST_F(ServerTest, Torch2ListKeysAndBarrierByteForByte) {
  start();
  Raw c(port_), other(port_);
  c.send(kValidate);
  other.send(kValidate);
  c.send(cat({u8(1), str("/k"), str("v")}));   // SET
  c.send(cat({u8(14), str("/q"), str("x")}));  // QUEUE_PUSH
  c.send(cat({u8(4), str("/n"), u64(1)}));     // ADD
  EXPECT_EQ(c.recv(8), u64(1));
  c.send(u8(17));  // LIST_KEYS
  EXPECT_EQ(c.recv(8 + 10 + 10), cat({u64(2), str("/k"), str("/n")}));
  c.send(cat({u8(18), str("/b1"), u64(1)}));  // BARRIER of one: passes at once
  EXPECT_EQ(c.recv(1), u8(0));
  c.send(cat({u8(18), str("/b2"), u64(2)}));  // BARRIER of two: waits for the other
  EXPECT_TRUE(c.silent(100));
  c.send(u8(7));  // the connection goes on meanwhile, as with a pending WAIT
  EXPECT_EQ(c.recv(8), u64(4));
  other.send(cat({u8(18), str("/b2"), u64(2)}));
  EXPECT_EQ(other.recv(1), u8(0));
  EXPECT_EQ(c.recv(1), u8(0));
  c.send(cat({u8(3), str("/b2")}));  // GET: the counter
  EXPECT_EQ(c.recv(9), str("2"));
  // Timed out: CANCEL_WAIT, WAIT_CANCELED; the arrival still counts.
  c.send(cat({u8(18), str("/b3"), u64(2)}));
  EXPECT_TRUE(c.silent(100));
  c.send(u8(12));
  EXPECT_EQ(c.recv(1), u8(1));
  other.send(cat({u8(18), str("/b3"), u64(2)}));
  EXPECT_EQ(other.recv(1), u8(0));
  EXPECT_TRUE(c.silent(200));  // the cancelled barrier is forgotten
  // A BARRIER on a value that is no counter breaks the protocol, as an ADD would.
  other.send(cat({u8(18), str("/k"), u64(1)}));
  EXPECT_TRUE(other.closed_by_peer());
  c.send(cat({u8(13), u32(7)}));  // PING
  EXPECT_EQ(c.recv(4), u32(7));
}

// A barrier of three holds its first two clients until the third arrives, and a plain ADD that
// does not bring the counter to the world size releases nobody. (PyTorch 2.15's libuv server
// releases a waiting BARRIER at any ADD or SET of its key, whatever the count: a deliberate
// difference, docs/store_protocol.md.)
TEST_F(ServerTest, Torch2BarrierWaitsForTheWholeWorld) {
  start();
  Raw a(port_), b(port_), c(port_), setter(port_);
  for (Raw* r : {&a, &b, &c, &setter}) r->send(kValidate);
  a.send(cat({u8(18), str("/bar"), u64(3)}));
  EXPECT_TRUE(a.silent(100));
  b.send(cat({u8(18), str("/bar"), u64(3)}));
  EXPECT_TRUE(a.silent(200));
  EXPECT_TRUE(b.silent(0));
  setter.send(cat({u8(3), str("/bar")}));  // GET: two arrived
  EXPECT_EQ(setter.recv(9), str("2"));
  c.send(cat({u8(18), str("/bar"), u64(3)}));
  EXPECT_EQ(c.recv(1), u8(0));
  EXPECT_EQ(a.recv(1), u8(0));
  EXPECT_EQ(b.recv(1), u8(0));
  // A plain ADD short of the world size releases nobody; one that brings the counter there does.
  a.send(cat({u8(18), str("/bar2"), u64(3)}));
  EXPECT_TRUE(a.silent(100));
  setter.send(cat({u8(4), str("/bar2"), u64(1)}));
  EXPECT_EQ(setter.recv(8), u64(2));
  EXPECT_TRUE(a.silent(200));
  setter.send(cat({u8(4), str("/bar2"), u64(1)}));
  EXPECT_EQ(setter.recv(8), u64(3));
  EXPECT_EQ(a.recv(1), u8(0));
}

// LIST_KEYS from a worker's connection lists its round's keys as it wrote them, without the
// namespace; an agent's lists every key.
TEST_F(ServerTest, Torch2ListKeysShowsAWorkerItsNamespaceOnly) {
  start();
  auto agent = client(std::nullopt, 5s, /*agent=*/true);
  agent->set("dlaunch/own", to_bytes("x"));
  begin_worker_namespace(*agent, "ns1/");
  Raw worker(port_);
  worker.send(cat({kValidate, u8(17)}));  // LIST_KEYS first: fixes its namespace too
  EXPECT_EQ(worker.recv(8), u64(0));
  worker.send(cat({u8(1), str("/x"), str("1")}));
  worker.send(u8(17));
  EXPECT_EQ(worker.recv(8 + 10), cat({u64(1), str("/x")}));
  Raw agent_raw(port_);
  agent_raw.send(cat({kValidate, u8(0xA3)}));  // DECLARE_AGENT
  EXPECT_EQ(agent_raw.recv(1), u8(0));
  agent_raw.send(u8(17));
  const Bytes all = cat({u64(3), str("dlaunch/own"), str(kWorkerNamespaceKey), str("ns1//x")});
  EXPECT_EQ(agent_raw.recv(all.size()), all);
}

// A 2.x client sending an opcode this server does not know, or a malformed frame: one log line
// that says what came and what was expected, that connection closed, the server serving on.
TEST_F(ServerTest, Torch2UnknownOpcodeOrMalformedFrameIsLoggedAndClosesOnlyThatConnection) {
  struct Case {
    Bytes frame;
    std::string logged;
  };
  const std::vector<Case> cases = {
      {cat({kValidate, u8(19)}),
       "unknown opcode 19 for the PyTorch 2.x dialect (it has 0-18, and dlaunch's 160-168): a "
       "PyTorch newer than this dlaunch knows, or a client that is no store client"},
      {cat({kValidate, u8(0xFF)}), "unknown opcode 255 for the PyTorch 2.x dialect"},
      {cat({kValidate, kValidate}), "VALIDATE after the first message"},
      {cat({kValidate, u8(1), str("k"), u64(1ull << 40)}), "value"},
      {cat({kValidate, u8(1), str("/t"), str("text"), u8(18), str("/t"), u64(1)}),
       "BARRIER: store key '/t' holds 'text', expected a decimal counter"},
  };
  for (const auto& c : cases) {
    start();  // a server of its own: its log lines are not held back by the previous one's
    auto good = client();
    good->set("k", to_bytes("v"));
    ::testing::internal::CaptureStderr();
    {
      Raw bad(port_);
      bad.send(c.frame);
      EXPECT_TRUE(bad.closed_by_peer()) << c.logged;
    }
    std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("store server: closing client 127.0.0.1:"), std::string::npos) << err;
    EXPECT_NE(err.find(c.logged), std::string::npos) << err;
    EXPECT_EQ(to_string(good->get("k")), "v");
    Raw fresh(port_);
    fresh.send(cat({kValidate, u8(13), u32(9)}));
    EXPECT_EQ(fresh.recv(4), u32(9));
    server_.reset();
  }
}

// dlaunch's FEATURES and WAIT_GET, byte for byte (docs/store_protocol.md).
TEST_F(ServerTest, WaitGetByteForByte) {
  start();
  Raw c(port_);
  c.send(cat({kValidate, u8(0xA3), u8(0xA4)}));  // DECLARE_AGENT, FEATURES
  // bits: 0 WAIT_GET, 1 DECLARE_RUN, 2 CHANNELS, 3 SHARED and GROUP_SAME channel frames,
  // 4 WILL
  EXPECT_EQ(c.recv(1 + 4), cat({u8(0), u32(31)}));
  c.send(cat({u8(1), str("v"), str("xy")}));       // SET v
  // WAIT_GET [w, v, none] with 60 s: parked on w only (v's presence does not release it).
  c.send(cat({u8(0xA5), u64(60000), u64(3), str("w"), str("v"), str("none")}));
  EXPECT_TRUE(c.silent(100));
  Raw other(port_);
  other.send(cat({kValidate, u8(1), str("w"), str("1")}));  // SET w from another client
  // STOP_WAITING, then each key marked present (1 + value) or absent (0).
  EXPECT_EQ(c.recv(1 + 1 + 9 + 1 + 10 + 1), cat({u8(0), u8(1), str("1"), u8(1), str("xy"), u8(0)}));
  // The server answers at the timeout itself: WAIT_TIMED_OUT and the values as they are.
  auto began = std::chrono::steady_clock::now();
  c.send(cat({u8(0xA5), u64(200), u64(2), str("never"), str("v")}));
  EXPECT_EQ(c.recv(1 + 1 + 1 + 10, 10000), cat({u8(2), u8(0), u8(1), str("xy")}));
  EXPECT_GE(std::chrono::steady_clock::now() - began, 190ms);
  // CANCEL_WAIT ends a parked WAIT_GET as it ends a WAIT, and the connection goes on; the
  // cancelled one's timer, firing later, answers nothing.
  c.send(cat({u8(0xA5), u64(300), u64(1), str("never")}));
  EXPECT_TRUE(c.silent(50));
  c.send(u8(12));
  EXPECT_EQ(c.recv(1), u8(1));
  c.send(cat({u8(0xA5), u64(0), u64(1), str("later")}));  // 0: no timeout
  EXPECT_TRUE(c.silent(600));
  other.send(cat({u8(1), str("later"), str("z")}));
  EXPECT_EQ(c.recv(1 + 1 + 9), cat({u8(0), u8(1), str("z")}));
  // WAIT_GET without keys breaks the protocol: that connection is closed.
  c.send(cat({u8(0xA5), u64(10), u64(0)}));
  EXPECT_TRUE(c.closed_by_peer());
}

// A server built before FEATURES closes the connection on it (an unknown opcode); a newer
// agent's client then connects again without asking and does without WAIT_GET: the same
// answers in more requests.
TEST_F(ServerTest, NewerAgentAgainstAnOlderServerFallsBackToTheOlderRequests) {
  TcpStoreServerOptions o;
  o.knows_features = false;
  start(o);
  Raw raw(port_);
  raw.send(cat({kValidate, u8(0xA3)}));
  EXPECT_EQ(raw.recv(1), u8(0));
  raw.send(u8(0xA4));
  EXPECT_TRUE(raw.closed_by_peer());
  auto agent = client(std::nullopt, 5s, /*agent=*/true);
  agent->set("v", to_bytes("xy"));
  auto got = agent->wait_get({"v", "none"}, 5s);
  EXPECT_TRUE(got.ready);
  ASSERT_EQ(got.values.size(), 2u);
  EXPECT_EQ(got.values[0], to_bytes("xy"));
  EXPECT_FALSE(got.values[1].has_value());
  got = agent->wait_get({"never", "v"}, 200ms);
  EXPECT_FALSE(got.ready);
  EXPECT_EQ(got.values[1], to_bytes("xy"));
  EXPECT_EQ(agent->get("v"), to_bytes("xy"));  // the connection still serves
}

// PyTorch 2.x semantics (TCPStoreLibUvBackend: queuePush -> wakeupOneWaitingClient): a push
// answers one parked WAIT on the queue's key, in arrival order; the others stay parked.
TEST_F(ServerTest, QueuePushWakesOneWaiterPerItemInArrivalOrder) {
  start();
  Raw first(port_), second(port_), pusher(port_);
  for (Raw* r : {&first, &second, &pusher}) r->send(kValidate);
  first.send(cat({u8(6), u64(1), str("q")}));  // WAIT q
  ASSERT_TRUE(first.silent(100));
  second.send(cat({u8(6), u64(1), str("q")}));
  ASSERT_TRUE(second.silent(100));
  pusher.send(cat({u8(14), str("q"), str("item1")}));  // QUEUE_PUSH
  EXPECT_EQ(first.recv(1), u8(0));                     // STOP_WAITING
  EXPECT_TRUE(second.silent(200)) << "one push must wake one waiter only";
  pusher.send(cat({u8(14), str("q"), str("item2")}));
  EXPECT_EQ(second.recv(1), u8(0));
  // Both connections go on: the woken client pops its item.
  first.send(cat({u8(15), str("q")}));
  EXPECT_EQ(first.recv(8 + 8 + 5), cat({u64(2), str("item1")}));
}

// A waiter that still misses another key does not swallow the push: the next waiter for which
// the queue was the last missing key gets it, and the first completes once its other key comes.
TEST_F(ServerTest, QueuePushPassesOverAWaiterStillMissingOtherKeys) {
  start();
  Raw both(port_), queue_only(port_), writer(port_);
  for (Raw* r : {&both, &queue_only, &writer}) r->send(kValidate);
  both.send(cat({u8(6), u64(2), str("q"), str("k")}));  // WAIT q, k
  ASSERT_TRUE(both.silent(100));
  queue_only.send(cat({u8(6), u64(1), str("q")}));
  ASSERT_TRUE(queue_only.silent(100));
  writer.send(cat({u8(14), str("q"), str("x")}));
  EXPECT_EQ(queue_only.recv(1), u8(0));
  EXPECT_TRUE(both.silent(200));
  writer.send(cat({u8(1), str("k"), str("v")}));  // SET k: q is still non-empty
  EXPECT_EQ(both.recv(1), u8(0));
}

// interrupt() from another thread ends a blocked call at once, and the client goes on.
TEST_F(ServerTest, ClientInterruptEndsABlockedGetAndTheClientGoesOn) {
  start();
  TcpStoreClientOptions o;
  o.port = port_;
  o.timeout = 60s;
  TcpStoreClient c(o);
  c.interrupt();  // no call in progress: nothing happens
  c.set("k", to_bytes("v"));
  auto t0 = std::chrono::steady_clock::now();
  auto blocked = std::async(std::launch::async, [&] { return c.get("never-set"); });
  EXPECT_EQ(blocked.wait_for(200ms), std::future_status::timeout);
  c.interrupt();
  ASSERT_EQ(blocked.wait_for(5s), std::future_status::ready) << "interrupt() did not end get()";
  EXPECT_THROW(blocked.get(), StoreInterruptedError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(to_string(c.get("k")), "v");  // reconnected
}

// Also while the client backs off between reconnect attempts (the store host is gone).
TEST_F(ServerTest, ClientInterruptEndsAReconnectLoop) {
  start();
  TcpStoreClientOptions o;
  o.port = port_;
  o.connect_timeout = 60s;
  o.timeout = 5s;
  TcpStoreClient c(o);
  server_->stop();
  EXPECT_THROW(c.get("k"), ClosedError);  // the close is seen mid-call: no retry there
  auto blocked = std::async(std::launch::async, [&] { c.set("k", {}); });
  EXPECT_EQ(blocked.wait_for(300ms), std::future_status::timeout) << "should be reconnecting";
  c.interrupt();
  ASSERT_EQ(blocked.wait_for(5s), std::future_status::ready) << "interrupt() did not end connect";
  EXPECT_THROW(blocked.get(), StoreInterruptedError);
}

TEST_F(ServerTest, DeletePrefixExtensionRemovesOnlyMatchingKeys) {
  start();
  auto c = client();
  c->set("/worker/attempt_0/a", {});
  c->set("/worker/attempt_0/b", {});
  c->set("/workers", {});
  EXPECT_EQ(c->delete_prefix("/worker/"), 2);
  EXPECT_FALSE(c->check({"/worker/attempt_0/a"}));
  EXPECT_TRUE(c->check({"/workers"}));
  Raw torch113(port_);  // not part of the 1.13 dialect: 0xA2 is a bad opcode there
  torch113.send(cat({u8(0xA2), str("/")}));
  EXPECT_TRUE(torch113.closed_by_peer());
}

// Deleting by prefix is an optional Store capability: the TCP client has it, and a prefix store
// over one passes it on (scoped); a store without it hosts no worker namespace.
TEST_F(ServerTest, DeletePrefixIsACapabilityOfTheTcpStoreOnly) {
  start();
  std::shared_ptr<TcpStoreClient> c = client();
  PrefixStore scoped("job", c);
  EXPECT_TRUE(c->can_delete_prefix());
  EXPECT_TRUE(scoped.can_delete_prefix());
  scoped.set("a/1", {});
  c->set("a/2", {});
  EXPECT_EQ(scoped.delete_prefix("a/"), 1);
  EXPECT_TRUE(c->check({"a/2"}));
  InMemoryStore memory;
  PrefixStore over_memory("job", std::make_shared<InMemoryStore>());
  EXPECT_FALSE(memory.can_delete_prefix());
  EXPECT_FALSE(over_memory.can_delete_prefix());
  EXPECT_THROW(memory.delete_prefix("a/"), StateError);
  EXPECT_FALSE(begin_worker_namespace(memory, "ns1/"));
  EXPECT_FALSE(memory.check({kWorkerNamespaceKey}));
  EXPECT_TRUE(begin_worker_namespace(*c, "ns1/"));
}

TEST_F(ServerTest, WorkerConnectionsGetTheNamespaceInForceAtTheirFirstKey) {
  start();
  auto agent = client(std::nullopt, 5s, /*agent=*/true);
  // No namespace yet: a worker's keys are the keys.
  auto early = client();
  early->set("k", to_bytes("unscoped"));
  EXPECT_EQ(to_string(agent->get("k")), "unscoped");
  begin_worker_namespace(*agent, "ns1/");
  auto w1 = client();
  w1->set("/worker/attempt_0/addr", to_bytes("round 1"));
  EXPECT_EQ(to_string(agent->get("ns1//worker/attempt_0/addr")), "round 1");
  EXPECT_FALSE(agent->check({"/worker/attempt_0/addr"}));
  EXPECT_EQ(to_string(early->get("k")), "unscoped");  // fixed at its first key
  // The next round: the old namespace's keys go, and new workers see none of them.
  begin_worker_namespace(*agent, "ns2/");
  EXPECT_FALSE(agent->check({"ns1//worker/attempt_0/addr"}));
  auto w2 = client();
  EXPECT_FALSE(w2->check({"/worker/attempt_0/addr"}));
  w2->set("/worker/attempt_0/addr", to_bytes("round 2"));
  EXPECT_EQ(to_string(agent->get("ns2//worker/attempt_0/addr")), "round 2");
  // PyTorch 1.13's clients (no handshake) are workers too.
  Raw torch(port_);
  torch.send(cat({u8(2), str("/worker/attempt_0/addr")}));  // GET
  EXPECT_EQ(torch.recv(15), str("round 2"));
  EXPECT_EQ(to_string(agent->get(kWorkerNamespaceKey)), "ns2/");
}

TEST_F(ServerTest, MalformedFrameClosesOnlyThatConnection) {
  TcpStoreServerOptions o;
  o.limits.max_value_bytes = 1 << 20;
  start(o);
  auto good = client();
  good->set("k", to_bytes("v"));
  {
    Raw bad(port_);
    bad.send(Bytes{'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P'});
    EXPECT_TRUE(bad.closed_by_peer());
  }
  {
    Raw big(port_);  // a 1 TiB value announced: refused before any of it arrives
    big.send(cat({kValidate, u8(1), str("k"), u64(1ull << 40)}));
    EXPECT_TRUE(big.closed_by_peer());
  }
  {
    Raw unknown(port_);
    unknown.send(cat({kValidate, u8(99)}));
    EXPECT_TRUE(unknown.closed_by_peer());
  }
  {
    Raw partial(port_);  // a frame cut short stays pending; the server does not block on it
    partial.send(cat({u8(0), u64(100), Bytes(10, 'x')}));
    EXPECT_EQ(to_string(good->get("k")), "v");
  }
  EXPECT_EQ(to_string(good->get("k")), "v");
  good->set("k2", to_bytes("still fine"));
  EXPECT_EQ(to_string(good->get("k2")), "still fine");
}

TEST_F(ServerTest, HoldsTwoThousandConnectionsAtOnce) {
  start();
  constexpr int kConns = 2000;
  std::vector<std::unique_ptr<Raw>> conns;
  for (int i = 0; i < kConns; ++i) conns.push_back(std::make_unique<Raw>(port_));
  for (int i = 0; i < kConns; ++i) {
    conns[i]->send(cat({kValidate, u8(4), str("n"), u64(1)}));
  }
  std::set<uint64_t> seen;
  for (int i = 0; i < kConns; ++i) {
    auto r = conns[i]->recv(8);
    ASSERT_EQ(r.size(), 8u) << "connection " << i;
    seen.insert(load_le<uint64_t>(r.data()));
  }
  EXPECT_EQ(seen.size(), size_t(kConns));  // every ADD answered with a distinct total
  EXPECT_EQ(*seen.rbegin(), uint64_t(kConns));
  EXPECT_EQ(server_->num_connections(), size_t(kConns));
  conns.clear();
  for (int i = 0; i < 100 && server_->num_connections() > 0; ++i) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(server_->num_connections(), 0u);
}

TEST_F(ServerTest, JobTokenKeepsStrangersOut) {
  TcpStoreServerOptions o;
  o.token = "right";
  start(o);
  EXPECT_THROW(client("wrong"), StateError);
  EXPECT_THROW(client(std::nullopt, 300ms), ConnectionError);  // refused: no agent proved it yet
  {
    Raw torch(port_);  // a PyTorch 1.13 client before any agent proved the token
    torch.send(cat({u8(3), str("k"), u64(1)}));
    EXPECT_TRUE(torch.closed_by_peer());
  }
  auto agent = client("right");  // an agent from 127.0.0.1 proves the token ...
  agent->set("k", to_bytes("v"));
  Raw torch(port_);  // ... so PyTorch workers on that host are served
  torch.send(cat({u8(2), str("k")}));
  EXPECT_EQ(torch.recv(9), str("v"));
}

TEST_F(ServerTest, StrictTokenModeRefusesEveryUnauthenticatedClient) {
  TcpStoreServerOptions o;
  o.token = "right";
  o.admit_unauthenticated_from_agent_hosts = false;
  start(o);
  auto agent = client("right");
  agent->set("k", to_bytes("v"));
  Raw torch(port_);
  torch.send(cat({u8(2), str("k")}));
  EXPECT_TRUE(torch.closed_by_peer());
}

// The host exception is for PyTorch's workers, which cannot prove the token; an agent that
// declares itself without proving it is refused from any address, with a reply that tells it
// why, so it stops at once instead of retrying for its whole join timeout.
TEST_F(ServerTest, AgentWithoutTheTokenIsRefusedAtOnceEvenFromAnAgentsHost) {
  TcpStoreServerOptions o;
  o.token = "right";
  start(o);
  auto agent = client("right", 5s, /*agent=*/true);  // 127.0.0.1 is now an agent's host
  agent->set("k", to_bytes("v"));
  {
    Raw raw(port_);
    raw.send(cat({kValidate, u8(0xA3), u8(0x0D), u32(7)}));  // DECLARE_AGENT, PING
    EXPECT_EQ(raw.recv(1), u8(1));                           // refused: no token
    EXPECT_TRUE(raw.closed_by_peer());                       // and nothing more
  }
  const auto began = std::chrono::steady_clock::now();
  try {
    client(std::nullopt, 60s, /*agent=*/true);
    FAIL() << "a tokenless agent was admitted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("this job requires a job token (DLAUNCH_JOB_TOKEN)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - began, 30s);  // not the 60 s connect timeout
  Raw torch(port_);  // PyTorch workers on the agent's host are still served
  torch.send(cat({u8(2), str("k")}));
  EXPECT_EQ(torch.recv(9), str("v"));
}

// One run per store: an agent of another run is refused at once, told the run the store
// serves; agents of the store's run, agents that declare none (older builds) and workers are
// served.
TEST_F(ServerTest, AgentOfAnotherRunIsRefusedWithTheRunTheStoreServes) {
  TcpStoreServerOptions o;
  o.run_id = "job-a";
  start(o);
  {
    Raw raw(port_);
    raw.send(cat({kValidate, u8(0xA3), u8(0xA6), str("job-b")}));
    EXPECT_EQ(raw.recv(1), u8(0));                               // DECLARE_AGENT accepted
    EXPECT_EQ(raw.recv(1 + 8 + 5), cat({u8(2), str("job-a")}));  // DECLARE_RUN refused
    EXPECT_TRUE(raw.closed_by_peer());
  }
  auto agent_of = [&](const std::string& run) {
    TcpStoreClientOptions c;
    c.port = port_;
    c.connect_timeout = 60s;
    c.timeout = 5s;
    c.agent = true;
    c.run_id = run;
    return std::make_shared<TcpStoreClient>(c);
  };
  try {
    agent_of("job-b");
    FAIL() << "an agent of another run was admitted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("serves run 'job-a'; this agent's run is 'job-b'"),
              std::string::npos)
        << e.what();
  }
  agent_of("job-a")->set("k", to_bytes("v"));
  EXPECT_EQ(agent_of("")->get("k"), to_bytes("v"));
  Raw torch(port_);
  torch.send(cat({u8(3), str("w"), u64(1)}));  // a 1.13 worker's ADD
  EXPECT_EQ(torch.recv(8), u64(1));
}

TEST_F(ServerTest, ClientWithTokenRefusesAStoreWithoutOne) {
  start();
  EXPECT_THROW(client("mine"), StateError);
}

TEST_F(ServerTest, PortInUseIsAClearErrorAndRestartRebindsAtOnce) {
  start();
  TcpStoreServerOptions o;
  o.port = port_;
  TcpStoreServer second(o);
  try {
    second.start();
    FAIL() << "expected AddressInUseError";
  } catch (const AddressInUseError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(port_)), std::string::npos);
  }
  auto c = client();
  c->set("k", {});
  server_->stop();
  TcpStoreServer again(o);  // reuse_address: no wait for TIME_WAIT sockets
  EXPECT_EQ(again.start(), port_);
}

TEST_F(ServerTest, BindsIpv6Literal) {
  TcpStoreServerOptions o;
  o.host = "::1";
  TcpStoreServer server(o);
  uint16_t port;
  try {
    port = server.start();
  } catch (const Error& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  TcpStoreClientOptions co;
  co.host = "::1";
  co.port = port;
  TcpStoreClient c(co);
  c.set("v6", to_bytes("yes"));
  EXPECT_EQ(to_string(c.get("v6")), "yes");
  EXPECT_EQ(c.endpoint(), "[::1]:" + std::to_string(port));
}

TEST_F(ServerTest, RefusesAnAddressThatIsNotThisMachines) {
  TcpStoreServerOptions o;
  o.host = "192.0.2.1";  // TEST-NET-1: never local
  TcpStoreServer server(o);
  EXPECT_THROW(server.start(), UsageError);
}

TEST_F(ServerTest, ConnectErrorNamesTheEndpoint) {
  start();
  uint16_t dead_port = port_;
  server_->stop();
  TcpStoreClientOptions o;
  o.port = dead_port;
  o.connect_timeout = 300ms;
  try {
    TcpStoreClient c(o);
    FAIL() << "expected ConnectionError";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(dead_port)),
              std::string::npos)
        << e.what();
  }
}

bool have_torch() {
  return std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") == 0;
}

TEST_F(ServerTest, RealPytorch113ClientTalksToOurServer) {
  if (!have_torch()) GTEST_SKIP() << "/usr/bin/python3 has no torch (apt-get install python3-torch)";
  start();
  auto ours = client();
  // PyTorch's TCPStore puts "/" in front of every user key on the wire.
  ours->set("/from_dlaunch", to_bytes("hello torch"));
  std::string script = R"PY(
import sys, datetime
import torch.distributed as d
s = d.TCPStore("127.0.0.1", int(sys.argv[1]), 2, False, datetime.timedelta(seconds=20))
s.set("from_torch", "42")
assert s.get("from_dlaunch") == b"hello torch", s.get("from_dlaunch")
assert s.add("ctr", 3) == 3 and s.add("ctr", 4) == 7
assert s.compare_set("cas", "", "first") == b"first"
assert s.compare_set("cas", "nope", "x") == b"first"
s.wait(["from_torch", "ctr"])
assert s.num_keys() >= 4
assert s.delete_key("cas") and not s.delete_key("cas")
s.set_timeout(datetime.timedelta(milliseconds=300))
try:
    s.get("absent")
    sys.exit("get of a missing key did not time out")
except RuntimeError:
    pass
print("torch-ok")
)PY";
  std::string path = ::testing::TempDir() + "/torch_store_client.py";
  std::ofstream(path) << script;
  std::string cmd = "/usr/bin/python3 " + path + " " + std::to_string(port_) + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  int status = pclose(p);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("torch-ok"), std::string::npos) << out;
  EXPECT_EQ(to_string(ours->get("/from_torch")), "42");
  EXPECT_EQ(ours->add("/ctr", 0), 7);
  EXPECT_EQ(ours->add("init/", 0), 1);  // the 1.13 client's own join counter
}

}  // namespace
}  // namespace dlaunch

namespace dlaunch {
namespace {

std::string run_python(const std::string& script, const std::string& args) {
  std::string path = ::testing::TempDir() + "/dlaunch_rdzv_" + std::to_string(::getpid()) + ".py";
  std::ofstream(path) << script;
  std::string cmd = "/usr/bin/python3 " + path + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "popen failed";
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  int status = pclose(p);
  return (status == 0 ? "" : "exit status " + std::to_string(status) + "\n") + out;
}

// PyTorch's own c10d rendezvous handler (what torchrun runs) over our server: the endpoint's
// port is taken, so both agents fall back to being clients of the dlaunch store.
TEST(TorchCompat, Pytorch113C10dRendezvousRunsOverOurStore) {
  if (std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 has no torch (apt-get install python3-torch)";
  }
  TcpStoreServer server(TcpStoreServerOptions{});
  uint16_t port = server.start();
  std::string script = R"PY(
import sys, multiprocessing as mp
def agent(port, q):
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
    p = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="compat",
                             min_nodes=2, max_nodes=2, join_timeout=60)
    store, rank, world = get_rendezvous_handler(p).next_rendezvous()
    store.set(f"hello{rank}", "x")
    store.get(f"hello{1 - rank}")
    q.put((rank, world))
if __name__ == "__main__":
    q = mp.get_context("spawn").Queue()
    ps = [mp.get_context("spawn").Process(target=agent, args=(int(sys.argv[1]), q)) for _ in range(2)]
    for p in ps: p.start()
    got = sorted(q.get(timeout=90) for _ in ps)
    for p in ps: p.join()
    assert got == [(0, 2), (1, 2)], got
    print("rdzv-ok")
)PY";
  std::string out = run_python(script, std::to_string(port));
  EXPECT_NE(out.find("rdzv-ok"), std::string::npos) << out;
  // The rendezvous state really lives in our server (PyTorch's c10d backend key).
  TcpStoreClientOptions o;
  o.port = port;
  TcpStoreClient ours(o);
  EXPECT_TRUE(ours.check({"/torch.rendezvous.compat"})) << "keys: " << ours.num_keys();
}

// PyTorch 1.13's client times a wait (and the wait inside get) out on its own and keeps the
// connection; every later request on it must work as against PyTorch's own server. The same
// script runs against ours and against a PyTorch server it starts itself; the transcripts must
// be the same. Its last steps make awaited keys appear: both servers then send the STOP_WAITING
// still due, which this client reads as the first byte of its next reply.
TEST_F(ServerTest, Pytorch113ClientGoesOnAfterATimedOutWaitAsAgainstPytorchsServer) {
  if (!have_torch()) GTEST_SKIP() << "/usr/bin/python3 has no torch (apt-get install python3-torch)";
  start();
  std::string script = R"PY(
import sys, datetime
import torch.distributed as d
T = datetime.timedelta

def transcript(port):
    lines = []
    def note(name, call):
        try:
            lines.append(f"{name} -> {call()!r}")
        except RuntimeError as e:
            lines.append(f"{name} raised RuntimeError")
    other = d.TCPStore("127.0.0.1", port, is_master=False, timeout=T(seconds=30))
    s = d.TCPStore("127.0.0.1", port, is_master=False, timeout=T(seconds=2))
    note("wait", lambda: s.wait(["never"], T(milliseconds=300)))
    note("get", lambda: s.get("not_yet"))
    note("set", lambda: s.set("k", "v"))
    note("get k", lambda: s.get("k"))
    note("num_keys", s.num_keys)
    note("delete_key", lambda: s.delete_key("k"))
    note("delete_key again", lambda: s.delete_key("k"))
    note("add", lambda: s.add("n", 5))
    note("compare_set", lambda: s.compare_set("n", "5", "6"))
    note("num_keys", s.num_keys)
    other.set("not_yet", "x")
    other.get("not_yet")  # the set is done, the late STOP_WAITING on its way
    note("num_keys after the late STOP_WAITING", s.num_keys)
    # Its own ADD makes the awaited key appear: ADD's value first, then the STOP_WAITING.
    s2 = d.TCPStore("127.0.0.1", port, is_master=False, timeout=T(seconds=2))
    note("wait for a counter", lambda: s2.wait(["counter"], T(milliseconds=300)))
    note("add to it", lambda: s2.add("counter", 5))
    note("num_keys after its STOP_WAITING", s2.num_keys)
    return lines

ours = transcript(int(sys.argv[1]))
server = d.TCPStore("127.0.0.1", 0, is_master=True, timeout=T(seconds=30))
torch = transcript(server.port)
for line in ours:
    print("ours:", line)
for line in torch:
    print("torch:", line)
)PY";
  std::string out = run_python(script, std::to_string(port_));
  std::vector<std::string> ours, torch;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("ours: ", 0) == 0) ours.push_back(line.substr(6));
    if (line.rfind("torch: ", 0) == 0) torch.push_back(line.substr(7));
  }
  ASSERT_EQ(ours.size(), 14u) << out;
  EXPECT_EQ(ours, torch) << out;
  const std::vector<std::string> expected_first = {
      "wait raised RuntimeError", "get raised RuntimeError", "set -> None",
      "get k -> b'v'",            "num_keys -> 1",           "delete_key -> True",
      "delete_key again -> False", "add -> 5",               "compare_set -> b'6'",
      "num_keys -> 1"};
  EXPECT_EQ(std::vector<std::string>(ours.begin(), ours.begin() + 10), expected_first) << out;
  EXPECT_EQ(ours[12], "add to it -> 5") << out;
}

}  // namespace
}  // namespace dlaunch
