// A node's store proxy: the node's workers connect to it as they would to the job's store, and
// it carries all their connections over ONE connection to the store (CHANNELS,
// rendezvous/tcp/channel_frames.h), so the store host holds one connection per node instead of
// one per worker, and reads their requests in a few large reads.
//
// What a worker observes does not change: the store runs one session per channel, so the
// dialect (1.13 or 2.x), the job token, the worker namespace, waits, timeouts and errors are
// the store's own, byte for byte. The proxy only frames bytes; it decodes the workers'
// requests (with the store's codec) to find where each ends and to group concurrent ones:
// GETs, MULTI_GETs, CHECKs, WAITs or ADDs of the same keys from several workers, received while
// the previous batch was on the wire, go up as one GROUP, which the store answers from one look
// at the table when it can prove that exact (TcpStoreState::handle_group); when the members'
// replies are the same bytes (the reads), the store sends them once (a SHARED frame) and the
// proxy copies them to each member. A read is never answered from anything but its own group's
// reply: a read that arrives after that reply has come goes up on its own, so no worker reads a
// value older than its request. Everything else goes up unchanged, in
// the order received per worker. A group never moves a worker's request ahead of that worker's
// earlier ones, nor past a request of another worker on the same key.
//
// Losses: a worker that disconnects closes its channel only (its waits end, as its own
// connection's close ends them at the store). When the store closes a worker's channel (a bad
// frame, a refusal), the proxy closes that worker's connection after what the store sent it.
// When the connection to the store is lost, the proxy closes every worker's connection and
// stops accepting: the workers see what they would see had the store host died.
//
// Threading: one thread of its own runs an Asio io_context; the methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"

namespace dlaunch {

struct StoreProxyOptions {
  std::string listen_host = "127.0.0.1";  // the workers are on this node
  uint16_t listen_port = 0;               // 0: pick a free port
  std::string store_host;                 // the job's store
  uint16_t store_port = 0;
  std::optional<std::string> token;       // the job token, proved to the store
  Duration connect_timeout = std::chrono::seconds(30);  // connect and handshake with the store
  bool group_requests = true;  // false: forward each request on its own (tests compare both)
};

// Counters for tests and /status (any thread).
struct StoreProxyStats {
  int64_t workers_accepted = 0;
  int64_t requests = 0;        // workers' requests forwarded
  int64_t grouped = 0;         // of which went up inside a GROUP of two or more
  int64_t upstream_writes = 0;
  int64_t shared_replies = 0;  // worker replies that came in a SHARED frame (one per worker)
};

class StoreProxy {
 public:
  explicit StoreProxy(StoreProxyOptions options);
  ~StoreProxy();  // stop()
  StoreProxy(const StoreProxy&) = delete;
  StoreProxy& operator=(const StoreProxy&) = delete;

  // Connects to the store and carries channels, then listens; returns the port the workers
  // connect to. Throws ConnectionError (the store cannot be reached in connect_timeout),
  // StateError (it answered but refused: wrong job token, or a build without CHANNELS: both
  // say what to do), SystemError/UsageError (cannot listen on listen_host:listen_port).
  uint16_t start();
  // Closes everything and joins the thread. Idempotent; never throws.
  void stop();
  uint16_t port() const;
  // False once the connection to the store was lost (the proxy then serves no one).
  bool connected() const;
  StoreProxyStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlaunch
