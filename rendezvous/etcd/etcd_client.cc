#include "rendezvous/etcd/etcd_client.h"

#include <fmt/format.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <mutex>

#include "common/log.h"
#include "rendezvous/tcp/host_port.h"

namespace dlaunch::etcd {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

// Runs one asynchronous operation on `ioc` until it completes or `deadline` passes; on the
// deadline the socket's pending operations are cancelled (the socket stays open, so a watch
// can continue) and asio::error::timed_out is returned. Runs on the calling thread.
template <typename Start>
error_code run_op(asio::io_context& ioc, tcp::socket& socket, TimePoint deadline, Start start) {
  error_code result = asio::error::would_block;
  bool done = false;
  bool timed_out = false;
  asio::steady_timer timer(ioc, deadline);
  timer.async_wait([&](error_code ec) {
    if (!ec && !done) {
      timed_out = true;
      error_code ignored;
      socket.cancel(ignored);
    }
  });
  start([&](error_code ec, auto&&...) {
    result = ec;
    done = true;
    timer.cancel();
  });
  ioc.restart();
  ioc.run();
  if (timed_out && result == asio::error::operation_aborted) return asio::error::timed_out;
  return result;
}

struct Connection {
  asio::io_context ioc{1};
  tcp::socket socket{ioc};
  beast::flat_buffer buffer;
};

void connect(Connection& c, const HostPort& hp, const std::string& endpoint, Duration timeout) {
  error_code ec;
  tcp::resolver resolver(c.ioc);
  // Forward resolution only (a name in --rdzv_endpoint); never reverse.
  auto results = resolver.resolve(hp.host, std::to_string(hp.port), ec);
  if (ec) {
    throw ConnectionError(
        fmt::format("cannot resolve etcd endpoint {}: {}; expected host:port "
                    "of etcd's client URL, e.g. 10.0.0.5:2379",
                    endpoint, ec.message()));
  }
  ec = run_op(c.ioc, c.socket, steady_clock().now() + timeout,
              [&](auto handler) { asio::async_connect(c.socket, results, handler); });
  if (ec) {
    error_code ignored;
    c.socket.close(ignored);
    throw ConnectionError(
        fmt::format("cannot connect to etcd at {}: {}; is etcd running and listening there "
                    "(--listen-client-urls)? For tests: tests/cluster/start_etcd.sh",
                    endpoint, ec == asio::error::timed_out ? "timed out" : ec.message()));
  }
  c.socket.set_option(tcp::no_delay(true), ec);
}

http::request<http::string_body> make_request(const std::string& host, const std::string& path,
                                              const std::string& body) {
  http::request<http::string_body> req{http::verb::post, path, 11};
  req.set(http::field::host, host);
  req.set(http::field::content_type, "application/json");
  req.keep_alive(true);
  req.body() = body;
  req.prepare_payload();
  return req;
}

[[noreturn]] void throw_status(const std::string& endpoint, const std::string& path,
                               unsigned status, const std::string& body) {
  GatewayError e = decode_error(body);
  throw GatewayStatusError(fmt::format("etcd at {} refused {} (HTTP {}): {} (gRPC code {})",
                                       endpoint, path, status, e.message, e.code),
                           e.code);
}

std::mutex& counts_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, int64_t>& counts() {
  static std::map<std::string, int64_t> c;  // guarded by counts_mutex()
  return c;
}

}  // namespace

std::map<std::string, int64_t> call_counts() {
  std::lock_guard<std::mutex> lock(counts_mutex());
  return counts();
}

void note(const std::string& what, int64_t n) {
  std::lock_guard<std::mutex> lock(counts_mutex());
  counts()[what] += n;
}

struct Client::Impl {
  ClientOptions options;
  HostPort host_port;
  std::mutex mu;
  std::vector<std::unique_ptr<Connection>> idle;  // guarded by mu

  std::unique_ptr<Connection> take(bool& reused) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!idle.empty()) {
        auto c = std::move(idle.back());
        idle.pop_back();
        reused = true;
        return c;
      }
    }
    reused = false;
    auto c = std::make_unique<Connection>();
    connect(*c, host_port, options.endpoint, options.connect_timeout);
    return c;
  }

  void give_back(std::unique_ptr<Connection> c) {
    std::lock_guard<std::mutex> lock(mu);
    if (idle.size() < 8) idle.push_back(std::move(c));
  }
};

Client::Client(ClientOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->host_port = parse_host_port(options.endpoint, 2379, "--rdzv_endpoint");
  impl_->options = std::move(options);
}

Client::~Client() = default;

const std::string& Client::endpoint() const {
  return impl_->options.endpoint;
}

std::string Client::call(const std::string& path, const std::string& body) {
  const auto host = impl_->host_port.to_string();
  note(path);
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    auto conn = impl_->take(reused);
    const TimePoint deadline = steady_clock().now() + impl_->options.request_timeout;
    auto req = make_request(host, path, body);
    error_code ec = run_op(conn->ioc, conn->socket, deadline,
                           [&](auto handler) { http::async_write(conn->socket, req, handler); });
    http::response<http::string_body> res;
    if (!ec) {
      ec = run_op(conn->ioc, conn->socket, deadline, [&](auto handler) {
        http::async_read(conn->socket, conn->buffer, res, handler);
      });
    }
    if (ec == asio::error::timed_out) {
      throw TimeoutError(fmt::format("etcd at {} did not answer {} within {:.1f} s", endpoint(),
                                     path, to_seconds(impl_->options.request_timeout)));
    }
    if (ec) {
      // A pooled connection the server closed while idle fails at once; retry on a fresh one.
      // (Only then: a fresh connection that breaks means etcd is gone.)
      const bool stale =
          reused && (ec == http::error::end_of_stream || ec == asio::error::eof ||
                     ec == asio::error::connection_reset || ec == asio::error::broken_pipe);
      if (stale && attempt == 0) continue;
      throw ConnectionError(fmt::format("etcd at {} broke the connection during {}: {}", endpoint(),
                                        path, ec.message()));
    }
    if (res.keep_alive()) impl_->give_back(std::move(conn));
    if (res.result() != http::status::ok) {
      throw_status(endpoint(), path, res.result_int(), res.body());
    }
    return std::move(res.body());
  }
}

int64_t Client::put(const std::string& key, const std::string& value, int64_t lease) {
  return decode_put(call("/v3/kv/put", encode_put(key, value, lease)));
}

RangeResponse Client::range(const std::string& key, const std::string& range_end, bool count_only) {
  return decode_range(call("/v3/kv/range", encode_range(key, range_end, count_only)));
}

std::optional<KeyValue> Client::get(const std::string& key) {
  auto r = range(key);
  if (r.kvs.empty()) return std::nullopt;
  return std::move(r.kvs.front());
}

int64_t Client::delete_range(const std::string& key, const std::string& range_end) {
  return decode_delete(call("/v3/kv/deleterange", encode_delete(key, range_end)));
}

TxnResponse Client::txn(const std::vector<Compare>& compares, const std::vector<Op>& success,
                        const std::vector<Op>& failure) {
  return decode_txn(call("/v3/kv/txn", encode_txn(compares, success, failure)));
}

LeaseGrant Client::lease_grant(int64_t ttl_seconds) {
  return decode_lease_grant(call("/v3/lease/grant", encode_lease_grant(ttl_seconds)));
}

std::optional<int64_t> Client::lease_keepalive(int64_t id) {
  return decode_lease_keepalive(call("/v3/lease/keepalive", encode_lease_id(id)));
}

std::optional<int64_t> Client::lease_time_to_live(int64_t id) {
  return decode_lease_time_to_live(call("/v3/lease/timetolive", encode_lease_id(id)));
}

void Client::lease_revoke(int64_t id) {
  try {
    call("/v3/lease/revoke", encode_lease_id(id));
  } catch (const GatewayStatusError& e) {
    if (e.code() != 5) throw;  // NOT_FOUND: already expired, which is what we wanted
  }
}

// --- watch ----------------------------------------------------------------------------------

struct Watch::Impl {
  Connection conn;
  std::string endpoint;
  http::response_parser<http::buffer_body> parser;
  std::string pending;  // bytes after the last complete line
  std::deque<WatchMessage> ready;
  std::atomic<bool> canceled{false};
  char chunk[16384];

  // Reads more of the stream; false when the deadline passed first.
  bool read_more(TimePoint deadline) {
    if (parser.is_done()) {
      throw ClosedError(fmt::format("etcd at {} ended the watch stream", endpoint));
    }
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof chunk;
    error_code ec = run_op(conn.ioc, conn.socket, deadline, [&](auto handler) {
      http::async_read_some(conn.socket, conn.buffer, parser, handler);
    });
    pending.append(chunk, sizeof chunk - parser.get().body().size);
    if (ec == http::error::need_buffer) ec = {};
    if (canceled) throw ClosedError("etcd watch was cancelled");
    if (ec == asio::error::timed_out) return false;
    if (ec) {
      throw ClosedError(
          fmt::format("etcd at {} closed the watch stream: {}", endpoint, ec.message()));
    }
    return true;
  }

  // Decodes the complete lines read so far into `ready`; returns whether one confirmed the
  // watch's creation.
  bool take_lines() {
    bool created = false;
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string line = pending.substr(start, nl - start);
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      WatchMessage m = decode_watch_line(line);
      if (m.canceled || m.compact_revision > 0) {
        throw ProtocolError(fmt::format(
            "etcd at {} cancelled the watch{}{}", endpoint,
            m.compact_revision > 0 ? fmt::format(": revision {} was compacted", m.compact_revision)
                                   : "",
            m.cancel_reason.empty() ? "" : fmt::format(": {}", m.cancel_reason)));
      }
      created = created || m.created;
      if (!m.events.empty()) ready.push_back(std::move(m));
    }
    pending.erase(0, start);
    return created;
  }
};

Watch::Watch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Watch::~Watch() {
  error_code ignored;
  impl_->conn.socket.close(ignored);
}

std::optional<WatchMessage> Watch::next(TimePoint deadline) {
  while (impl_->ready.empty()) {
    if (impl_->canceled) throw ClosedError("etcd watch was cancelled");
    bool got = impl_->read_more(deadline);
    impl_->take_lines();
    if (!got && impl_->ready.empty()) return std::nullopt;
  }
  WatchMessage m = std::move(impl_->ready.front());
  impl_->ready.pop_front();
  note("watch events", static_cast<int64_t>(m.events.size()));
  return m;
}

void Watch::cancel() {
  if (impl_->canceled.exchange(true)) return;
  // Closing must happen on the thread that runs the watch's io_context: post it there. If no
  // next() is running, the next one runs it first thing.
  asio::post(impl_->conn.ioc, [impl = impl_.get()] {
    error_code ignored;
    impl->conn.socket.close(ignored);
  });
}

std::unique_ptr<Watch> Client::watch(const std::string& key, const std::string& range_end,
                                     int64_t start_revision) {
  note("watches opened");
  auto impl = std::make_unique<Watch::Impl>();
  impl->endpoint = endpoint();
  impl->parser.body_limit(boost::none);  // a watch stream has no end
  connect(impl->conn, impl_->host_port, endpoint(), impl_->options.connect_timeout);
  const TimePoint deadline = steady_clock().now() + impl_->options.request_timeout;
  auto req = make_request(impl_->host_port.to_string(), "/v3/watch",
                          encode_watch_create(key, range_end, start_revision));
  error_code ec = run_op(impl->conn.ioc, impl->conn.socket, deadline,
                         [&](auto handler) { http::async_write(impl->conn.socket, req, handler); });
  if (!ec) {
    ec = run_op(impl->conn.ioc, impl->conn.socket, deadline, [&](auto handler) {
      http::async_read_header(impl->conn.socket, impl->conn.buffer, impl->parser, handler);
    });
  }
  if (ec == asio::error::timed_out) {
    throw TimeoutError(fmt::format("etcd at {} did not open a watch within {:.1f} s", endpoint(),
                                   to_seconds(impl_->options.request_timeout)));
  }
  if (ec) {
    throw ConnectionError(
        fmt::format("etcd at {} broke the watch request: {}", endpoint(), ec.message()));
  }
  if (impl->parser.get().result() != http::status::ok) {
    while (!impl->parser.is_done() && impl->read_more(deadline)) {
    }
    throw_status(endpoint(), "/v3/watch", impl->parser.get().result_int(), impl->pending);
  }
  // The first message confirms the watch ({"result":{"created":true}}); events may follow in
  // the same read.
  while (!impl->take_lines()) {
    if (!impl->read_more(deadline)) {
      throw TimeoutError(fmt::format("etcd at {} did not confirm a watch within {:.1f} s",
                                     endpoint(), to_seconds(impl_->options.request_timeout)));
    }
  }
  return std::unique_ptr<Watch>(new Watch(std::move(impl)));
}

}  // namespace dlaunch::etcd
