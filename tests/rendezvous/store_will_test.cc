// A connection's last will (WILL, docs/store_protocol.md) on a real server over loopback: the
// counter moves when a connection that named it ends uncleared (closed, or its process
// SIGKILLed), not after a clear, not at the server's own shutdown; a malformed WILL is a clear
// error that closes that connection only.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "rendezvous/tcp/tcp_store_client.h"
#include "rendezvous/tcp/tcp_store_server.h"
#include "rendezvous/tcp/tcp_store_state.h"
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
const Bytes kDeclareAgent = u8(0xA3);
Bytes will(const std::string& key) { return cat({u8(0xA8), str(key)}); }

class WillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TcpStoreServer>(TcpStoreServerOptions{});
    port_ = server_->start();
    TcpStoreClientOptions o;
    o.port = port_;
    o.timeout = 10s;
    o.agent = true;
    reader_ = std::make_shared<TcpStoreClient>(o);
  }
  // The counter as it is now (0 when missing), without waiting.
  int64_t counter(const std::string& key) { return reader_->add(key, 0); }
  // Waits (generously) for the counter to reach `n`.
  bool reaches(const std::string& key, int64_t n) {
    for (int i = 0; i < 1000; ++i) {
      if (counter(key) >= n) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  std::unique_ptr<TcpStoreServer> server_;
  uint16_t port_ = 0;
  std::shared_ptr<TcpStoreClient> reader_;
};

TEST_F(WillTest, AClosedConnectionsWillAddsOneAndAClearedOneNothing) {
  Raw cleared(port_);
  cleared.send(cat({kValidate, kDeclareAgent, will("w/cleared"), will("")}));
  EXPECT_EQ(cleared.recv(3), cat({u8(0), u8(0), u8(0)}));
  Raw abrupt(port_);
  abrupt.send(cat({kValidate, kDeclareAgent, will("w/abrupt")}));
  EXPECT_EQ(abrupt.recv(2), cat({u8(0), u8(0)}));
  EXPECT_EQ(counter("w/abrupt"), 0);  // nothing while the connection lives
  cleared.close();
  abrupt.close();
  // Closes are handled in the order they come: once the second one counted, the first one
  // was handled too.
  EXPECT_TRUE(reaches("w/abrupt", 1));
  EXPECT_EQ(counter("w/cleared"), 0);
  EXPECT_EQ(counter("w/abrupt"), 1);
}

TEST_F(WillTest, AKilledProcessesWillAddsOne) {
  // The child only makes system calls (it is forked from a process with threads): the frame is
  // made here, before the fork.
  const Bytes hello = cat({kValidate, kDeclareAgent, will("w/killed")});
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port_);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) ::_exit(3);
    if (::send(fd, hello.data(), hello.size(), 0) != ssize_t(hello.size())) ::_exit(4);
    uint8_t replies[2];
    size_t got = 0;
    while (got < 2) {
      ssize_t n = ::recv(fd, replies + got, 2 - got, 0);
      if (n <= 0) ::_exit(5);
      got += size_t(n);
    }
    if (::write(ready[1], "r", 1) != 1) ::_exit(6);
    while (true) ::pause();
  }
  ::close(ready[1]);
  char r = 0;
  ASSERT_EQ(::read(ready[0], &r, 1), 1) << "the child could not register its will";
  ::close(ready[0]);
  EXPECT_EQ(counter("w/killed"), 0);
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(reaches("w/killed", 1));
}

// A client that connects again names its will from the new connection, which takes it over:
// the old connection's end counts for nothing (the server may see it late, after a partition).
TEST_F(WillTest, ANewConnectionTakesTheWillOver) {
  Raw old_connection(port_);
  old_connection.send(cat({kValidate, kDeclareAgent, will("w/moved")}));
  EXPECT_EQ(old_connection.recv(2), cat({u8(0), u8(0)}));
  Raw new_connection(port_);
  new_connection.send(cat({kValidate, kDeclareAgent, will("w/moved")}));
  EXPECT_EQ(new_connection.recv(2), cat({u8(0), u8(0)}));
  Raw marker(port_);
  marker.send(cat({kValidate, kDeclareAgent, will("w/marker")}));
  EXPECT_EQ(marker.recv(2), cat({u8(0), u8(0)}));
  old_connection.close();
  marker.close();
  EXPECT_TRUE(reaches("w/marker", 1));
  EXPECT_EQ(counter("w/moved"), 0);
  new_connection.close();
  EXPECT_TRUE(reaches("w/moved", 1));
}

TEST_F(WillTest, TheClientRegistersAndClearsItsWill) {
  TcpStoreClientOptions o;
  o.port = port_;
  o.timeout = 10s;
  o.agent = true;
  {
    TcpStoreClient dies(o);
    EXPECT_TRUE(dies.set_will("w/client"));
  }
  EXPECT_TRUE(reaches("w/client", 1));
  {
    TcpStoreClient leaves(o);
    EXPECT_TRUE(leaves.set_will("w/client"));
    leaves.clear_will();
  }
  {
    TcpStoreClient marker(o);
    EXPECT_TRUE(marker.set_will("w/client-marker"));
  }
  EXPECT_TRUE(reaches("w/client-marker", 1));
  EXPECT_EQ(counter("w/client"), 1);
  // A worker's connection asks no FEATURES: it registers nothing.
  o.agent = false;
  TcpStoreClient worker(o);
  EXPECT_FALSE(worker.set_will("w/worker"));
}

TEST_F(WillTest, AnOlderServerHasNoWills) {
  TcpStoreServerOptions old;
  old.knows_features = false;
  TcpStoreServer server(old);
  TcpStoreClientOptions o;
  o.port = server.start();
  o.timeout = 10s;
  o.agent = true;
  TcpStoreClient agent(o);
  EXPECT_FALSE(agent.set_will("w/old"));
  EXPECT_EQ(agent.add("w/old", 0), 0);  // the connection still serves
}

TEST_F(WillTest, AMalformedWillIsAClearErrorAndClosesOnlyThatConnection) {
  Raw good(port_);
  good.send(cat({kValidate, kDeclareAgent, will("w/good")}));
  EXPECT_EQ(good.recv(2), cat({u8(0), u8(0)}));
  ::testing::internal::CaptureStderr();
  {
    Raw bad(port_);
    bad.send(cat({kValidate, kDeclareAgent}));
    EXPECT_EQ(bad.recv(1), u8(0));
    bad.send(cat({u8(0xA8), u64(1ull << 40)}));  // WILL with a key length over the limit
    EXPECT_TRUE(bad.closed_by_peer());
  }
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("store server: closing client 127.0.0.1:"), std::string::npos) << err;
  EXPECT_NE(err.find("WILL: key of 1099511627776 bytes over the limit"), std::string::npos) << err;
  // The other connection and its will are untouched.
  good.send(cat({u8(13), u32(7)}));  // PING
  EXPECT_EQ(good.recv(4), u32(7));
  EXPECT_EQ(counter("w/good"), 0);
}

// A fake session for the state alone (pure logic): the server's stop forgets every will before
// it closes the connections (TcpStoreConnectionManager::stop_all), and a forgotten will is not
// carried out when its session goes.
class Session final : public StoreSession {
  void replied() override {}
  void resumed() override {}
};

TEST(WillState, TheServersOwnShutdownCarriesOutNoWill) {
  TcpStoreState state;
  auto agent = std::make_shared<Session>();
  std::string error;
  wire::Request declare;
  declare.op = wire::Op::kDeclareAgent;
  state.handle(*agent, declare, error);
  wire::Request q;
  q.op = wire::Op::kWill;
  q.keys = {"w/shutdown"};
  ASSERT_EQ(state.handle(*agent, q, error), TcpStoreState::Handled::kReplied) << error;
  state.forget_wills();
  agent->closed = true;
  state.drop(*agent);
  EXPECT_EQ(state.local_add("w/shutdown", 0), 0);
  // Without the shutdown, the same drop carries it out.
  auto other = std::make_shared<Session>();
  state.handle(*other, declare, error);
  q.keys = {"w/shutdown"};
  state.handle(*other, q, error);
  other->closed = true;
  state.drop(*other);
  EXPECT_EQ(state.local_add("w/shutdown", 0), 1);
}

}  // namespace
}  // namespace dlaunch
