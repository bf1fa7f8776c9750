// The job's TCP store server, hosted inside an agent. It speaks PyTorch's TCPStore protocol in
// both dialects (1.13 and 2.x, told apart per connection) plus dlaunch's job-token handshake,
// so agents, dtrain workers and unmodified PyTorch workers share one store.
//
// Threading: the server runs its own Asio io_context on its own thread, event-driven (no
// thread per client): the agent's loop thread may block in rendezvous while the server must
// keep answering. All methods here are thread-safe.
//
// Behaviour: binds exactly the given address (no reverse DNS; "[v6]" literals work); port 0
// picks a free port. SO_REUSEADDR so a restarted agent can rebind at once, but a port held by
// a live listener fails with AddressInUseError. TCP_NODELAY, listen backlog 4096, accepts in a
// loop, and raises the soft RLIMIT_NOFILE to the hard limit so 10,000+ clients fit. GET and
// MULTI_GET on missing keys are parked per key and answered when a set/add/compare_set/append
// creates them; a WAIT is answered then too, but, as in PyTorch's servers, its client's later
// requests are served meanwhile (tcp_store_state.h). A malformed or oversized frame closes that connection only (logged,
// rate-limited). stop() closes every connection; clients blocked on it see the close.
//
// Job token: when `token` is set, a client must prove it (see rendezvous/tcp/job_token.h) before
// any store operation. PyTorch clients cannot; with admit_unauthenticated_from_agent_hosts
// they are served when they connect from an address where an authenticated client already
// connected from (an agent's host); an agent (DECLARE_AGENT) never is: it is refused at once.
// docs/rendezvous.md explains the threat model.
//
// One run per store: when `run_id` is set, an agent that declares another run (DECLARE_RUN) is
// refused at once with the run this store serves, so two jobs on one endpoint never share
// keys (their workers' namespaces are store-wide: rendezvous/tcp/worker_namespace.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/error.h"
#include "rendezvous/tcp/store_stats.h"
#include "rendezvous/tcp/tcp_store_server_options.h"

namespace dlaunch {

// The port is held by another listening socket (another job, or a stale agent).
class AddressInUseError : public SystemError {
 public:
  using SystemError::SystemError;
};

class TcpStoreServer {
 public:
  explicit TcpStoreServer(TcpStoreServerOptions options);
  ~TcpStoreServer();  // stop()
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // Binds, listens and starts the server thread; returns the port actually bound. Throws
  // AddressInUseError, SystemError (bind/listen failed: the message names address and port),
  // UsageError (the host is not an address of this machine or does not resolve).
  uint16_t start();
  // Closes the listener and every connection and joins the thread. Idempotent; never throws.
  void stop();

  uint16_t port() const;
  const std::string& host() const;
  // Connections open right now (approximate while clients come and go).
  size_t num_connections() const;
  // Requests served, their latency, keys and connections (for the agent's /status).
  StoreStatsSnapshot stats() const;
  // Writes of the hosting process itself (the agent publishing its status endpoint), without a
  // client connection: run on the server thread; block until done (at most 5 s). Keys are
  // unscoped (as an agent's connection sees them). Throws ClosedError when the server is not
  // running, ProtocolError as Store::add.
  int64_t add_local(const std::string& key, int64_t delta);
  void set_local(const std::string& key, const Bytes& value);
  // begin_worker_namespace() (rendezvous/tcp/worker_namespace.h) for a job without a
  // rendezvous (one static node), whose agent starts each attempt's workers itself.
  void begin_worker_namespace_local(const std::string& ns);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlaunch
