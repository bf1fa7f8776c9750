// A master name that resolves late, against a real DNS server (dnsmasq, in a network and mount
// namespace of this test's own: tests/support/private_dns.h). The store's client waits for a
// name that is NXDOMAIN at first and connects within a second after it appears; when the name
// then moves to another address (the master's pod replaced), its reconnect resolves anew and
// reaches the new store. A name that never appears ends in one error naming the name and the
// resolver's answer, after a few lines, not a stack of them. Root only (skipped otherwise).
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "common/error.h"
#include "rendezvous/tcp/name_wait.h"
#include "rendezvous/tcp/tcp_store_client.h"
#include "rendezvous/tcp/tcp_store_server.h"
#include "tests/support/private_dns.h"
#include "tests/support/subprocess.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;
using testing::count_of;
using testing::PrivateDns;

const std::string kDomain = "dlaunch.test";
const std::string kMaster = "master." + kDomain;

class LateNameTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = PrivateDns::unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
    dns_ = std::make_unique<PrivateDns>(kDomain);
    ASSERT_EQ(testing::resolve_now(kMaster), "") << "the name resolves before it was published";
  }
  std::unique_ptr<PrivateDns> dns_;
};

std::shared_ptr<TcpStoreServer> store_on(const std::string& address, uint16_t port) {
  TcpStoreServerOptions o;
  o.host = address;
  o.port = port;
  auto server = std::make_shared<TcpStoreServer>(o);
  server->start();
  return server;
}

TEST_F(LateNameTest, TheClientConnectsOnceTheNameAppearsAndFollowsItWhenItMoves) {
  const uint16_t port = 29400;
  auto first = store_on("127.0.0.1", port);
  TcpStoreClientOptions o;
  o.host = kMaster;
  o.port = port;
  o.connect_timeout = 60s;
  o.reconnect_timeout = 10s;  // the replaced master's name resolves to its new address by then
  ::testing::internal::CaptureStderr();
  auto connected = std::async(std::launch::async, [&] {
    auto client = std::make_unique<TcpStoreClient>(o);
    return std::make_pair(std::chrono::steady_clock::now(), std::move(client));
  });
  // Past the first note (5 s), well before the second (10 s).
  std::this_thread::sleep_for(6s);
  ASSERT_EQ(connected.wait_for(0s), std::future_status::timeout)
      << "connected while the name did not resolve";
  const auto appeared = dns_->publish(kMaster, "127.0.0.1");
  ASSERT_EQ(connected.wait_for(30s), std::future_status::ready) << "no connection 30 s after "
                                                                   "the name appeared";
  auto [when, client] = connected.get();
  const std::string waiting = ::testing::internal::GetCapturedStderr();
  const double lag = std::chrono::duration<double>(when - appeared).count();
  std::printf("connected %.3f s after the name appeared\n", lag);
  RecordProperty("seconds_from_name_to_connection", std::to_string(lag));
  EXPECT_EQ(client->add("n", 1), 1);
  // It said it was waiting for the name, at 5 s, once.
  EXPECT_EQ(count_of(waiting, "does not resolve yet"), 1u) << waiting;
  EXPECT_NE(waiting.find("'" + kMaster + "' does not resolve yet (Name or service not known)"),
            std::string::npos)
      << waiting;

  // The master is replaced: a new store on another address, the name moves there, the old one
  // goes. The client's next calls fail once (its connection closed), then reconnect through
  // the name, resolved anew.
  auto second = store_on("127.0.0.2", port);
  dns_->publish(kMaster, "127.0.0.2");
  first->stop();
  int64_t n = -1;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (n < 0 && std::chrono::steady_clock::now() < deadline) {
    try {
      n = client->add("n", 1);
    } catch (const Error& e) {
      std::this_thread::sleep_for(50ms);
    }
  }
  EXPECT_EQ(n, 1) << "the client did not reach the new store at 127.0.0.2 (the old one said 1 "
                     "before, and is stopped)";
  EXPECT_GE(second->num_connections(), 1u);
}

// Never there: one error at the connect timeout that names the name, what the resolver said
// and what to do; meanwhile a note at 0.2, 0.4, 0.8, 1.6 s (the 5, 10, 20, 40 s schedule,
// scaled), never one per lookup.
TEST_F(LateNameTest, AClientOfANameThatNeverAppearsFailsWithOneClearError) {
  TcpStoreClientOptions o;
  o.host = kMaster;
  o.port = 29400;
  o.connect_timeout = 3s;
  o.first_waiting_note = 200ms;
  ::testing::internal::CaptureStderr();
  std::string message;
  try {
    TcpStoreClient client(o);
    ADD_FAILURE() << "connected to a name that does not resolve";
  } catch (const ConnectionError& e) {
    message = e.what();
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(message.find("its host name '" + kMaster + "' never resolved"), std::string::npos)
      << message;
  EXPECT_NE(message.find("Name or service not known"), std::string::npos) << message;
  EXPECT_NE(message.find("join_timeout"), std::string::npos) << message;
  const size_t notes = count_of(log, "still waiting for the store");
  EXPECT_GE(notes, 3u) << log;
  EXPECT_LE(notes, 4u) << log;
}

// Hosting the store (node 0, the c10d endpoint's owner) waits for its own name as well.
TEST_F(LateNameTest, WaitingForANameReturnsOnceItAppearsOrSaysWhatItGot) {
  auto waited = std::async(std::launch::async, [&] {
    wait_until_name_resolves(kMaster, 60s, "this agent hosts the job's store there");
    return std::chrono::steady_clock::now();
  });
  std::this_thread::sleep_for(1s);
  const auto appeared = dns_->publish(kMaster, "127.0.0.1");
  ASSERT_EQ(waited.wait_for(30s), std::future_status::ready);
  const double lag = std::chrono::duration<double>(waited.get() - appeared).count();
  std::printf("the wait ended %.3f s after the name appeared\n", lag);

  ::testing::internal::CaptureStderr();
  try {
    wait_until_name_resolves("never." + kDomain, 2s, "this agent hosts the job's store there");
    ADD_FAILURE() << "a name that was never published resolved";
  } catch (const ConnectionError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'never." + kDomain + "' did not resolve within 2 s"), std::string::npos)
        << m;
    EXPECT_NE(m.find("Name or service not known"), std::string::npos) << m;
    EXPECT_NE(m.find("this agent hosts the job's store there"), std::string::npos) << m;
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "a note before the first 5 s";
}

}  // namespace
}  // namespace dlaunch
