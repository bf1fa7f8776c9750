// The store server's own counters (rendezvous/tcp/store_stats.h), read as the agent's /status reads
// them: through a real server and a real client.
#include "rendezvous/tcp/store_stats.h"

#include <gtest/gtest.h>

#include "rendezvous/tcp/tcp_store_client.h"
#include "rendezvous/tcp/tcp_store_server.h"

namespace dlaunch {
namespace {

TEST(StoreStats, QuantilesAreBucketBoundsOfWhatWasRecorded) {
  StoreStats stats;
  for (int i = 0; i < 98; ++i) stats.record(std::chrono::microseconds(3), 5);
  stats.record(std::chrono::milliseconds(3), 6);
  stats.record(std::chrono::milliseconds(3), 7);
  StoreStatsSnapshot s = stats.snapshot();
  EXPECT_EQ(s.requests, 100);
  EXPECT_EQ(s.keys, 7);
  EXPECT_DOUBLE_EQ(s.p50_seconds, 4e-6);  // 3 us falls in the (2, 4] us bucket
  EXPECT_GE(s.p99_seconds, 3e-3);
  EXPECT_LE(s.p99_seconds, 6e-3);
  EXPECT_EQ(s.cumulative.back(), 100);
}

TEST(StoreStats, EmptyHasNoLatency) {
  StoreStats stats;
  StoreStatsSnapshot s = stats.snapshot();
  EXPECT_EQ(s.requests, 0);
  EXPECT_EQ(s.p50_seconds, 0);
  EXPECT_EQ(s.p99_seconds, 0);
}

TEST(StoreStats, ServerCountsRequestsKeysAndConnections) {
  TcpStoreServer server(TcpStoreServerOptions{});
  uint16_t port = server.start();
  TcpStoreClientOptions o;
  o.port = port;
  o.agent = true;
  TcpStoreClient client(o);
  client.set("a", to_bytes("1"));
  client.set("b", to_bytes("2"));
  client.add("c", 1);
  EXPECT_EQ(to_string(client.get("a")), "1");
  StoreStatsSnapshot s = server.stats();
  EXPECT_GE(s.requests, 4);  // and whatever the handshake takes
  EXPECT_EQ(s.keys, 3);
  EXPECT_EQ(s.connections, 1);
  EXPECT_GT(s.p99_seconds, 0);
}

TEST(StoreStats, LocalWritesReachClientsAndTheKeyCount) {
  TcpStoreServer server(TcpStoreServerOptions{});
  uint16_t port = server.start();
  EXPECT_EQ(server.add_local("dlaunch/n", 2), 2);
  server.set_local("dlaunch/k", to_bytes("v"));
  EXPECT_EQ(server.stats().keys, 2);
  TcpStoreClientOptions o;
  o.port = port;
  o.agent = true;
  TcpStoreClient client(o);
  EXPECT_EQ(to_string(client.get("dlaunch/k")), "v");
  EXPECT_EQ(client.add("dlaunch/n", 1), 3);
  server.stop();
  EXPECT_THROW(server.set_local("x", to_bytes("y")), ClosedError);
}

}  // namespace
}  // namespace dlaunch
