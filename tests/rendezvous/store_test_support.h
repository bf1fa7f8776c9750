// Builds every Store implementation for the shared typed suite: each "backend" makes a store
// and further clients of the same underlying table (threads that block need their own client).
#pragma once

#include <memory>
#include <string>

#include "rendezvous/store/in_memory_store.h"
#include "rendezvous/proxy/store_proxy.h"
#include "rendezvous/store/prefix_store.h"
#include "rendezvous/tcp/tcp_store_client.h"
#include "rendezvous/tcp/tcp_store_server.h"

namespace dlaunch::test {

struct InMemoryBackend {
  static constexpr bool kIsTcp = false;
  std::shared_ptr<InMemoryStore> table = std::make_shared<InMemoryStore>();
  std::shared_ptr<Store> client() { return table; }
  void stop_server() {}
};

struct PrefixBackend {
  static constexpr bool kIsTcp = false;
  std::shared_ptr<InMemoryStore> table = std::make_shared<InMemoryStore>();
  std::shared_ptr<Store> client() { return std::make_shared<PrefixStore>("run/7", table); }
  void stop_server() {}
};

// kAgent: the client declares itself an agent's (and asks FEATURES: WAIT_GET in one request);
// kOlderServer: the server plays a build older than FEATURES (the agent's client falls back).
template <bool kWithToken, bool kAgent = false, bool kOlderServer = false>
struct TcpBackendT {
  static constexpr bool kIsTcp = true;
  std::unique_ptr<TcpStoreServer> server;
  uint16_t port = 0;
  TcpBackendT() {
    TcpStoreServerOptions o;
    o.host = "127.0.0.1";
    if (kWithToken) o.token = "s3cret-token";
    o.knows_features = !kOlderServer;
    server = std::make_unique<TcpStoreServer>(o);
    port = server->start();
  }
  std::shared_ptr<Store> client() {
    TcpStoreClientOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    o.connect_timeout = std::chrono::seconds(5);
    if (kWithToken) o.token = "s3cret-token";
    o.agent = kAgent;
    return std::make_shared<TcpStoreClient>(o);
  }
  void stop_server() { server->stop(); }
};
using TcpBackend = TcpBackendT<false>;
using TcpTokenBackend = TcpBackendT<true>;
using TcpAgentBackend = TcpBackendT<false, true>;
using TcpAgentTokenBackend = TcpBackendT<true, true>;
using TcpAgentOlderServerBackend = TcpBackendT<false, true, true>;

// Clients through a node's store proxy (rendezvous/proxy/store_proxy.h) to an in-process
// server: every request on a channel of the proxy's one connection, concurrent ones grouped.
template <bool kWithToken>
struct ProxyBackendT {
  static constexpr bool kIsTcp = true;
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<StoreProxy> proxy;
  uint16_t port = 0;
  ProxyBackendT() {
    TcpStoreServerOptions o;
    o.host = "127.0.0.1";
    if (kWithToken) o.token = "s3cret-token";
    server = std::make_unique<TcpStoreServer>(o);
    StoreProxyOptions p;
    p.store_port = server->start();
    p.store_host = "127.0.0.1";
    if (kWithToken) p.token = "s3cret-token";
    proxy = std::make_unique<StoreProxy>(p);
    port = proxy->start();
  }
  std::shared_ptr<Store> client() {
    TcpStoreClientOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    o.connect_timeout = std::chrono::seconds(5);
    if (kWithToken) o.token = "s3cret-token";
    return std::make_shared<TcpStoreClient>(o);
  }
  // The store host dies; the proxy stays.
  void stop_server() { server->stop(); }
};
using ProxyBackend = ProxyBackendT<false>;
using ProxyTokenBackend = ProxyBackendT<true>;

}  // namespace dlaunch::test
