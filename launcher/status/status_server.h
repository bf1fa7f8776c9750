// A small HTTP/1.1 server (Boost.Beast) for the agent's status and control endpoints
// (agent_monitor.h routes the requests). It runs on the io_context it is given — the agent's
// loop — so a handler may read agent state without locks; every socket operation is
// asynchronous and a handler must not block, so serving never holds up supervision.
//
// Limits: requests up to 64 KiB, 10 s to send one (a slow or idle client is dropped), at most
// 64 connections at once (more are closed at accept). Keep-alive is honoured (Prometheus
// scrapes reuse their connection). stop() closes the listener and every connection; nothing
// is left behind (no thread of its own, no descriptor).
//
// Beast stays in status_server.cc: its headers cost seconds of compile time per unit.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace boost::asio {
class io_context;
}

namespace dlaunch {

struct HttpRequest {
  std::string method;                          // "GET", "POST"
  std::string target;                          // "/status?x=1"
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string peer;  // "127.0.0.1:53122", for the log
  // The path without the query string, and one query parameter ("" when absent).
  std::string path() const;
  std::string query(const std::string& name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// Called on the loop thread; answers by calling `respond` exactly once, now or later (from the
// loop thread too). Not answering leaves the client waiting until it gives up.
using HttpRespond = std::function<void(HttpResponse)>;
using HttpHandler = std::function<void(const HttpRequest&, HttpRespond)>;

class StatusServer {
 public:
  StatusServer(boost::asio::io_context& io, HttpHandler handler);
  ~StatusServer();  // stop()
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  // Binds `host` (an IP address; a name is resolved forward, its first address) on `port` (0:
  // a free one) and starts accepting; returns the bound port. Throws UsageError (the address
  // is not this machine's, or does not resolve) or SystemError (the port is taken: the
  // message names it and says how to choose another).
  uint16_t start(const std::string& host, uint16_t port);
  // Closes the listener and every open connection. Idempotent; never throws.
  void stop();
  // "127.0.0.1:41234", "[::1]:41234": where clients reach it ("" before start()).
  std::string address() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Whether `peer` ("10.0.0.5:4242", "[::1]:80") comes from a loopback address.
bool is_loopback_peer(const std::string& peer);

}  // namespace dlaunch
