// A small etcd v3 client over the JSON gateway (HTTP/1.1, POST /v3/...), enough for a Store and
// a rendezvous: kv put/range/deleterange/txn, lease grant/keepalive/revoke, and watch streams.
// Boost.Beast does the HTTP; it stays in etcd_client.cc (pimpl) because its headers cost
// seconds per translation unit. Message encoding and the gateway's quirks live in etcd_codec.h.
//
// Several members: the endpoint may list members of one etcd cluster (etcd_endpoints.h). Calls
// go to one member; when it refuses a connection, the next in the list is tried at once, and
// when it breaks a call, times out or answers UNAVAILABLE (no leader), later calls go to the
// next one. A call that broke is sent again to the next member only when sending it twice is
// harmless (range, put, delete, lease renewal/lookup/revoke); a transaction or a lease grant
// throws, and its caller decides (they retry ConnectionError).
//
// Blocking and timeouts: every unary call blocks until etcd answers or `request_timeout`
// passes (TimeoutError; the connection is dropped). Connections are pooled and reused
// (keep-alive), so concurrent calls from several threads run in parallel on separate sockets.
// A Watch owns its own connection; next() blocks until events arrive or its deadline passes.
//
// Errors: ConnectionError (no member accepts a connection / the connection broke mid-call /
// etcd answered UNAVAILABLE, naming the member), TimeoutError, ProtocolError (not the gateway's
// JSON), GatewayStatusError (etcd answered with a gRPC error, e.g. "requested lease not found").
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/error.h"
#include "rendezvous/etcd/etcd_codec.h"

namespace dlaunch::etcd {

// etcd refused the request: a gRPC status in an HTTP error answer.
class GatewayStatusError : public StateError {
 public:
  GatewayStatusError(const std::string& what, int code) : StateError(what), code_(code) {}
  int code() const { return code_; }  // gRPC code: 5 NOT_FOUND (e.g. the lease), 3, 9, 14...

 private:
  int code_;
};

struct ClientOptions {
  // "host:port" of etcd's client URL, or a comma-separated list of a cluster's members
  // (etcd_endpoints.h: "http://" allowed, default port 2379).
  std::string endpoint;
  Duration connect_timeout = std::chrono::seconds(5);
  Duration request_timeout = std::chrono::seconds(10);
};

class Watch;

// Process-wide counts of what this process asked of etcd, for benchmarks and diagnostics
// (etcd_rdzv_agent --stats, bench/etcd): one entry per gateway path ("/v3/kv/txn"), plus
// "watch events" received, "watches opened", and what callers note() (EtcdStore's
// "failed compare-and-swap txns"). Thread-safe; cheap (one mutex per call).
std::map<std::string, int64_t> call_counts();
void note(const std::string& what, int64_t n = 1);

class Client {
 public:
  // Does not connect yet; a malformed endpoint (or list) throws UsageError.
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& endpoint() const;  // as given: the whole list

  int64_t put(const std::string& key, const std::string& value, int64_t lease = 0);
  RangeResponse range(const std::string& key, const std::string& range_end = "",
                      bool count_only = false);
  std::optional<KeyValue> get(const std::string& key);
  int64_t delete_range(const std::string& key, const std::string& range_end = "");
  TxnResponse txn(const std::vector<Compare>& compares, const std::vector<Op>& success,
                  const std::vector<Op>& failure);

  LeaseGrant lease_grant(int64_t ttl_seconds);
  // The TTL the lease has again, or nullopt when it already expired (etcd forgot it).
  std::optional<int64_t> lease_keepalive(int64_t id);
  // The whole seconds lease `id` has left (another agent's too; 0: less than one), or nullopt
  // when it expired or never existed.
  std::optional<int64_t> lease_time_to_live(int64_t id);
  // Revokes the lease, deleting its keys at once. An unknown lease is not an error.
  void lease_revoke(int64_t id);

  // Opens a watch on [key, range_end) from `start_revision` (0: from now) and blocks until
  // etcd confirms it (request_timeout).
  std::unique_ptr<Watch> watch(const std::string& key, const std::string& range_end,
                               int64_t start_revision);

  // The raw call, for tests and rare requests: POST `path` with a JSON body, the 200 body back.
  std::string call(const std::string& path, const std::string& body);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One watch stream. next() may be called from one thread at a time; cancel() from any thread.
class Watch {
 public:
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  // The next message carrying events, or nullopt when `deadline` passes first (the watch stays
  // usable). Throws ClosedError when the stream ends or cancel() was called, ProtocolError when
  // etcd cancels the watch (e.g. its start revision was compacted).
  std::optional<WatchMessage> next(TimePoint deadline);
  // Ends the stream; a next() blocked in another thread returns with ClosedError. Idempotent.
  void cancel();

 private:
  friend class Client;
  struct Impl;
  explicit Watch(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlaunch::etcd
