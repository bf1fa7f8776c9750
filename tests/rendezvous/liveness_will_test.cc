// The store liveness against a real store server: a neighbour whose keep-alive connection
// ended (its will was carried out) and that does not come back is dead after the grace, long
// before the window; one that connects again and beats is not.
#include <gtest/gtest.h>

#include <thread>

#include "rendezvous/handlers/liveness.h"
#include "rendezvous/tcp/tcp_store_client.h"
#include "rendezvous/tcp/tcp_store_server.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

// A window no test waits out: a verdict within it comes from the connection's end.
constexpr Duration kWindow = 30s;
constexpr Duration kGrace = 500ms;

class LivenessWillTest : public ::testing::Test {
 protected:
  void SetUp() override { port_ = server_.start(); }
  std::shared_ptr<Store> connect() {
    TcpStoreClientOptions o;
    o.port = port_;
    o.timeout = 10s;
    o.agent = true;
    return std::make_shared<TcpStoreClient>(o);
  }
  // A node's keep-alive as KeepAlive runs it: its own connection, its will, a beat at once.
  std::unique_ptr<Liveness> node(const std::string& id) {
    auto l = make_store_liveness(connect(), "p", id, kWindow, steady_clock());
    l->use_connection_wills(kGrace);
    l->beat();
    return l;
  }
  // Asks `observer` about `id` every 50 ms for at most `patience`; true once it is dead.
  static bool found_dead(Liveness& observer, const std::string& id, Duration patience) {
    auto until = std::chrono::steady_clock::now() + patience;
    while (std::chrono::steady_clock::now() < until) {
      if (!observer.dead({id}).empty()) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }
  TcpStoreServer server_{TcpStoreServerOptions{}};
  uint16_t port_ = 0;
};

TEST_F(LivenessWillTest, ANodeWhoseConnectionEndedAndDoesNotComeBackIsDeadAfterTheGrace) {
  auto observer = node("o");
  auto victim = node("v");
  EXPECT_TRUE(observer->dead({"v"}).empty());  // the first look starts its window
  const auto killed_at = std::chrono::steady_clock::now();
  victim.reset();  // its connection closes without clearing the will, as when SIGKILLed
  ASSERT_TRUE(found_dead(*observer, "v", kWindow / 2))
      << "not found dead within half the window: the connection's end was not used";
  EXPECT_TRUE(observer->found_by_connection_end("v"));
  // Not before the grace (no keep-alive came for it), and far before the window.
  const auto took = std::chrono::steady_clock::now() - killed_at;
  EXPECT_GE(took, kGrace);
  EXPECT_LT(took, kWindow / 3);
}

// Killed before the observer's first look (of a round): that look finds every connection the
// node counted ended.
TEST_F(LivenessWillTest, ANodeKilledBeforeTheFirstLookIsDeadAfterTheGrace) {
  auto observer = node("o");
  auto victim = node("v");
  victim.reset();
  std::this_thread::sleep_for(200ms);  // the server sees the close (not needed for the verdict)
  ASSERT_TRUE(found_dead(*observer, "v", kWindow / 2));
  EXPECT_TRUE(observer->found_by_connection_end("v"));
}

TEST_F(LivenessWillTest, ANodeThatConnectsAgainAndBeatsIsNotDead) {
  auto observer = node("o");
  auto flaky = node("f");
  EXPECT_TRUE(observer->dead({"f"}).empty());
  flaky.reset();       // its connection broke...
  flaky = node("f");   // ...and it came back at once: a new connection, its will, a beat
  EXPECT_FALSE(found_dead(*observer, "f", 4 * kGrace));
  // The same again with the observer seeing the end before the node is back.
  auto again = make_store_liveness(connect(), "p", "f", kWindow, steady_clock());
  flaky.reset();
  EXPECT_TRUE(observer->dead({"f"}).empty());
  again->use_connection_wills(kGrace);
  again->beat();
  EXPECT_FALSE(found_dead(*observer, "f", 4 * kGrace));
}

TEST_F(LivenessWillTest, ANodeThatLeftCleanlyIsNotReportedByItsConnectionsEnd) {
  auto observer = node("o");
  auto leaver = node("l");
  EXPECT_TRUE(observer->dead({"l"}).empty());
  leaver->leave();
  leaver.reset();
  EXPECT_FALSE(found_dead(*observer, "l", 4 * kGrace));
}

}  // namespace
}  // namespace dlaunch
