// The store server's own counters (rendezvous/tcp/store_stats.h), read as the agent's /status reads
// them: through a real server and a real client.
#include "rendezvous/tcp/store_stats.h"

#include <gtest/gtest.h>

#include <thread>

#include "rendezvous/proxy/store_proxy.h"
#include "rendezvous/tcp/tcp_store_client.h"
#include "rendezvous/tcp/tcp_store_server.h"

namespace dlaunch {
namespace {

TEST(StoreStats, QuantilesAreBucketBoundsOfWhatWasRecorded) {
  StoreStats stats;
  for (int i = 0; i < 98; ++i) stats.record(wire::Op::kGet, false, std::chrono::microseconds(3), 5);
  stats.record(wire::Op::kSet, false, std::chrono::milliseconds(3), 6);
  stats.record(wire::Op::kSet, true, std::chrono::milliseconds(3), 7);
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

// The counts by op tell an agent's requests from a worker's (a session that never declared
// itself an agent's), which is how the workers' traffic model in docs/store_protocol.md is checked.
TEST(StoreStats, ServerCountsRequestsByOpAndByWhoAsked) {
  TcpStoreServer server(TcpStoreServerOptions{});
  uint16_t port = server.start();
  TcpStoreClientOptions agent_options;
  agent_options.port = port;
  agent_options.agent = true;
  TcpStoreClient agent(agent_options);
  agent.set("a", to_bytes("1"));
  agent.add("n", 1);
  agent.add("n", 1);
  TcpStoreClientOptions worker_options;
  worker_options.port = port;
  TcpStoreClient worker(worker_options);
  worker.set("w", to_bytes("2"));
  worker.add("m", 5);
  StoreStatsSnapshot s = server.stats();
  EXPECT_EQ(s.agent_requests_by_op["SET"], 1);
  EXPECT_EQ(s.agent_requests_by_op["ADD"], 2);
  EXPECT_EQ(s.agent_requests_by_op["DECLARE_AGENT"], 1);
  EXPECT_EQ(s.worker_requests_by_op["SET"], 1);
  EXPECT_EQ(s.worker_requests_by_op["ADD"], 1);
  EXPECT_EQ(s.worker_requests_by_op.count("DECLARE_AGENT"), 0u);
  int64_t total = 0;
  for (const auto* by_op : {&s.agent_requests_by_op, &s.worker_requests_by_op}) {
    for (const auto& [op, n] : *by_op) total += n;
  }
  EXPECT_EQ(total, s.requests);
}

// Connections open now, the most open at once, and how many were accepted: a closed one leaves
// the first and stays in the others.
TEST(StoreStats, ServerCountsPeakAndAcceptedConnections) {
  TcpStoreServer server(TcpStoreServerOptions{});
  uint16_t port = server.start();
  TcpStoreClientOptions o;
  o.port = port;
  auto wait_for_open = [&](int64_t n) {  // the server learns of a close when it reads the EOF
    for (int i = 0; i < 500 && server.stats().connections != n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  {
    TcpStoreClient first(o);
    TcpStoreClient second(o);
    EXPECT_EQ(first.add("n", 1), 1);
    EXPECT_EQ(second.add("n", 1), 2);
  }
  wait_for_open(0);
  TcpStoreClient third(o);
  EXPECT_EQ(third.add("n", 1), 3);
  StoreStatsSnapshot s = server.stats();
  EXPECT_EQ(s.connections, 1);
  EXPECT_EQ(s.connections_peak, 2);
  EXPECT_EQ(s.connections_accepted, 3);
  EXPECT_EQ(s.channels_opened, 0);
}

// Workers behind a node's store proxy are one connection at the store (the proxy's), and the
// channels it opened for them are counted apart.
TEST(StoreStats, WorkersBehindAStoreProxyAreChannelsOfOneConnection) {
  TcpStoreServer server(TcpStoreServerOptions{});
  StoreProxyOptions po;
  po.store_host = "127.0.0.1";
  po.store_port = server.start();
  StoreProxy proxy(po);
  TcpStoreClientOptions o;
  o.port = proxy.start();
  TcpStoreClient a(o), b(o), c(o);
  EXPECT_EQ(a.add("n", 1), 1);  // answered, so counted (a SET has no reply to wait for)
  EXPECT_EQ(b.add("n", 1), 2);
  EXPECT_EQ(c.add("n", 1), 3);
  StoreStatsSnapshot s = server.stats();
  EXPECT_EQ(s.connections, 1);
  EXPECT_EQ(s.connections_peak, 1);
  EXPECT_EQ(s.connections_accepted, 1);
  EXPECT_EQ(s.channels_opened, 3);
  EXPECT_EQ(s.worker_requests_by_op["ADD"], 3);
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
