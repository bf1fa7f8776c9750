// The etcd client given several members (--rdzv_endpoint in etcdctl's form, "a:2379,b:2379"):
// it talks to one and moves to the next when that one refuses or breaks, so losing the member of
// the first endpoint of a healthy cluster costs nothing. Against a private 3-member cluster on
// loopback (private_etcd.h), which the test damages, and the fixture's etcd behind a dead
// endpoint.
#include <gtest/gtest.h>

#include <thread>

#include "etcd_test_env.h"
#include "private_etcd.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

class EtcdFailoverTest : public test::EtcdTest {};

// A get of a missing key blocks on a watch: a set through another client of the same endpoint
// list releases it.
void expect_a_blocked_get_released(EtcdStore& store, const etcd::ClientOptions& o,
                                   const std::string& prefix) {
  EtcdStore other(std::make_shared<etcd::Client>(o), prefix);
  std::thread setter([&] {
    std::this_thread::sleep_for(300ms);
    other.set("later", to_bytes("x"));
  });
  store.set_timeout(30s);
  EXPECT_EQ(to_string(store.get("later")), "x");
  setter.join();
}

// The first endpoint of the list never answers (nothing listens there): every call, and every
// watch, goes to the next one without the caller seeing an error.
TEST_F(EtcdFailoverTest, AListWhoseFirstMemberIsDownWorksThroughTheNext) {
  etcd::ClientOptions o;
  o.endpoint = "127.0.0.1:1," + endpoint_;  // nothing listens on port 1
  o.connect_timeout = 2s;
  auto store = std::make_shared<EtcdStore>(std::make_shared<etcd::Client>(o), prefix_);
  store->set("k", to_bytes("v"));
  EXPECT_EQ(to_string(store->get("k")), "v");
  EXPECT_EQ(store->add("n", 2), 2);
  expect_a_blocked_get_released(*store, o, prefix_);
}

// No member answers: one sentence naming each, saying what to do, and no test script.
TEST_F(EtcdFailoverTest, NoMemberAnsweringIsOneConnectionErrorNamingEach) {
  etcd::ClientOptions o;
  o.endpoint = "127.0.0.1:1,127.0.0.1:3";  // nothing listens on ports 1 and 3
  o.connect_timeout = 2s;
  EtcdStore s(std::make_shared<etcd::Client>(o), prefix_);
  try {
    s.set("k", to_bytes("v"));
    FAIL() << "expected ConnectionError";
  } catch (const ConnectionError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot connect to any of the 2 etcd members"), std::string::npos) << what;
    EXPECT_NE(what.find("127.0.0.1:1: "), std::string::npos) << what;
    EXPECT_NE(what.find("127.0.0.1:3: "), std::string::npos) << what;
    EXPECT_NE(what.find("start etcd, or check --rdzv_endpoint"), std::string::npos) << what;
    EXPECT_EQ(what.find("tests/"), std::string::npos) << what;
  }
}

// A healthy 3-member cluster loses the member of the first endpoint (SIGKILL, while the client
// holds pooled connections to it): calls and a blocked get go on through the others.
TEST_F(EtcdFailoverTest, LosingTheFirstEndpointsMemberOfAClusterCostsNothing) {
  test::PrivateEtcd cluster(3);
  ASSERT_TRUE(cluster.ok()) << cluster.start_log();
  etcd::ClientOptions o;
  o.endpoint = cluster.endpoints();
  auto store = std::make_shared<EtcdStore>(std::make_shared<etcd::Client>(o), prefix_);
  store->set("k", to_bytes("1"));
  EXPECT_EQ(store->add("n", 1), 1);
  cluster.kill_member(1);
  EXPECT_EQ(to_string(store->get("k")), "1");
  store->set("k", to_bytes("2"));
  EXPECT_EQ(to_string(store->get("k")), "2");
  EXPECT_EQ(store->add("n", 1), 2);
  expect_a_blocked_get_released(*store, o, prefix_);
}

// The leader of a 3-member cluster dies: until the others elect a new one (a second or two),
// etcd answers UNAVAILABLE, which the client turns into ConnectionError (what the rendezvous
// retries), not a refusal; then every call works again, with the data intact.
TEST_F(EtcdFailoverTest, LosingTheLeaderIsAShortConnectionErrorThenNothing) {
  test::PrivateEtcd cluster(3);
  ASSERT_TRUE(cluster.ok()) << cluster.start_log();
  etcd::ClientOptions o;
  o.endpoint = cluster.endpoints();
  auto store = std::make_shared<EtcdStore>(std::make_shared<etcd::Client>(o), prefix_);
  store->set("k", to_bytes("1"));
  std::optional<int> leader;
  ASSERT_TRUE([&] {
    for (int n = 0; n < 100 && !(leader = cluster.leader()); ++n)
      std::this_thread::sleep_for(100ms);
    return leader.has_value();
  }());
  cluster.kill_member(*leader);
  int written = 0;
  for (int n = 0; n < 300 && written < 5; ++n) {
    try {
      store->set("k", to_bytes(std::to_string(2 + written)));
      EXPECT_EQ(to_string(store->get("k")), std::to_string(2 + written));
      ++written;
    } catch (const ConnectionError& e) {
      std::this_thread::sleep_for(100ms);  // the election; anything else fails the test
    }
  }
  EXPECT_EQ(written, 5);
  EXPECT_EQ(store->add("n", 1), 1);
}

}  // namespace
}  // namespace dlaunch
