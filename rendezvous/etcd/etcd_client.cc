#include "rendezvous/etcd/etcd_client.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
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
#include "rendezvous/etcd/etcd_endpoints.h"
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
  size_t member = 0;  // which endpoint of the client's list it is connected to
};

// Connects `c` to one etcd member; throws ConnectionError naming it and the reason.
void connect(Connection& c, const HostPort& hp, Duration timeout) {
  error_code ec;
  tcp::resolver resolver(c.ioc);
  // Forward resolution only (a name in --rdzv_endpoint); never reverse.
  auto results = resolver.resolve(hp.host, std::to_string(hp.port), ec);
  if (ec) {
    throw ConnectionError(
        fmt::format("{}: cannot resolve the name ({})", hp.to_string(), ec.message()));
  }
  ec = run_op(c.ioc, c.socket, steady_clock().now() + timeout,
              [&](auto handler) { asio::async_connect(c.socket, results, handler); });
  if (ec) {
    error_code ignored;
    c.socket.close(ignored);
    throw ConnectionError(fmt::format("{}: {}", hp.to_string(),
                                      ec == asio::error::timed_out ? "timed out" : ec.message()));
  }
  c.socket.set_option(tcp::no_delay(true), ec);
}

// The sentence when no member of `members` accepted a connection; `reasons` says why each
// refused ("host:port: Connection refused").
std::string unreachable_sentence(const std::vector<HostPort>& members,
                                 const std::vector<std::string>& reasons) {
  const std::string health =
      fmt::format("`etcdctl --endpoints http://{} endpoint health` shows whether it answers",
                  members[0].to_string());
  if (members.size() == 1) {
    return fmt::format(
        "cannot connect to etcd at {}; expected etcd's client port there: start etcd, or check "
        "--rdzv_endpoint (and that etcd listens on that address: --listen-client-urls); {}",
        reasons.front(), health);
  }
  return fmt::format(
      "cannot connect to any of the {} etcd members of --rdzv_endpoint ({}); expected at least "
      "one to answer on its client port: start etcd, or check --rdzv_endpoint (and etcd's "
      "--listen-client-urls); {}",
      members.size(), fmt::join(reasons, "; "), health);
}

// Calls that may be sent again to another member when the connection broke after sending:
// doing them twice does what doing them once does. A transaction (a compare-and-swap, an
// arrival counted) or a lease grant is not: its caller hears ConnectionError and decides.
bool may_resend(const std::string& path) {
  return path == "/v3/kv/range" || path == "/v3/kv/put" || path == "/v3/kv/deleterange" ||
         path == "/v3/lease/keepalive" || path == "/v3/lease/timetolive" ||
         path == "/v3/lease/revoke";
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

// Whether etcd's error answer means "cannot serve now" rather than "refused this request":
// gRPC code 14 (UNAVAILABLE: no leader after the leader died, "request timed out, possibly due
// to previous leader failure", the member stopping), 4 (DEADLINE_EXCEEDED), or the gateway's
// own deadline (code 2, "context deadline exceeded", seen on a lease grant without quorum).
bool cannot_serve_now(const GatewayError& e) {
  return e.code == 14 || e.code == 4 ||
         (e.code == 2 && e.message.find("deadline exceeded") != std::string::npos);
}

struct Client::Impl {
  ClientOptions options;
  std::vector<HostPort> members;  // --rdzv_endpoint's list, in its order
  std::mutex mu;
  size_t preferred = 0;  // guarded by mu: the member new connections try first
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
    return open();
  }

  // A new connection to the preferred member or, when it does not accept, to the next one in
  // the list that does (which becomes the preferred one). ConnectionError when none does.
  std::unique_ptr<Connection> open() {
    size_t first;
    {
      std::lock_guard<std::mutex> lock(mu);
      first = preferred;
    }
    std::vector<std::string> reasons;
    for (size_t i = 0; i < members.size(); ++i) {
      auto c = std::make_unique<Connection>();
      c->member = (first + i) % members.size();
      try {
        connect(*c, members[c->member], options.connect_timeout);
      } catch (const ConnectionError& e) {
        reasons.push_back(e.what());
        continue;
      }
      if (i > 0) prefer(c->member, reasons.back());
      return c;
    }
    throw ConnectionError(unreachable_sentence(members, reasons));
  }

  // `member` broke a call or refused a connection: later calls go to the next member first,
  // and its idle connections (broken too, most likely) are dropped.
  void failed(size_t member, const std::string& why) {
    if (members.size() == 1) return;
    const size_t next = (member + 1) % members.size();
    std::lock_guard<std::mutex> lock(mu);
    drop_idle_locked(member);
    if (preferred != member) return;  // another call moved on already
    preferred = next;
    announce_locked(next, why);
  }

  void prefer(size_t member, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (preferred == member) return;
    drop_idle_locked(preferred);
    preferred = member;
    announce_locked(member, why);
  }

  void drop_idle(size_t member) {
    std::lock_guard<std::mutex> lock(mu);
    drop_idle_locked(member);
  }

  void drop_idle_locked(size_t member) {
    idle.erase(std::remove_if(idle.begin(), idle.end(),
                              [&](const auto& c) { return c->member == member; }),
               idle.end());
  }

  // Said once per process and member switched to, not once per client (an agent has several).
  void announce_locked(size_t member, const std::string& why) {
    static std::mutex announced_mu;
    static std::string announced;  // guarded by announced_mu
    std::lock_guard<std::mutex> lock(announced_mu);
    if (announced == members[member].to_string()) return;
    announced = members[member].to_string();
    log_warning("etcd: {}; using the member at {} (the next of --rdzv_endpoint's {})", why,
                announced, members.size());
  }

  void give_back(std::unique_ptr<Connection> c) {
    std::lock_guard<std::mutex> lock(mu);
    if (idle.size() < 8) idle.push_back(std::move(c));
  }
};

Client::Client(ClientOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->members = parse_endpoints(options.endpoint, "--rdzv_endpoint");
  impl_->options = std::move(options);
}

Client::~Client() = default;

const std::string& Client::endpoint() const {
  return impl_->options.endpoint;
}

std::string Client::call(const std::string& path, const std::string& body) {
  note(path);
  const size_t n_members = impl_->members.size();
  size_t resent = 0;  // to another member, after a broken call (may_resend) or an UNAVAILABLE
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    auto conn = impl_->take(reused);
    const size_t member_index = conn->member;  // conn may go back to the pool below
    const std::string member = impl_->members[member_index].to_string();
    const TimePoint deadline = steady_clock().now() + impl_->options.request_timeout;
    auto req = make_request(member, path, body);
    error_code ec = run_op(conn->ioc, conn->socket, deadline,
                           [&](auto handler) { http::async_write(conn->socket, req, handler); });
    http::response<http::string_body> res;
    if (!ec) {
      ec = run_op(conn->ioc, conn->socket, deadline, [&](auto handler) {
        http::async_read(conn->socket, conn->buffer, res, handler);
      });
    }
    if (ec == asio::error::timed_out) {
      impl_->failed(member_index, fmt::format("{} did not answer {} in time", member, path));
      if (may_resend(path) && ++resent < n_members) continue;
      throw TimeoutError(fmt::format("etcd at {} did not answer {} within {:.1f} s", member, path,
                                     to_seconds(impl_->options.request_timeout)));
    }
    if (ec) {
      // A pooled connection the server closed while idle fails at once, before etcd saw the
      // request; retry on a fresh one (to the next member if this one is gone). Only then: a
      // fresh connection that breaks means this member is gone.
      const bool stale =
          reused && (ec == http::error::end_of_stream || ec == asio::error::eof ||
                     ec == asio::error::connection_reset || ec == asio::error::broken_pipe);
      if (stale && attempt == 0) {
        impl_->drop_idle(member_index);
        continue;
      }
      impl_->failed(member_index,
                    fmt::format("{} broke the connection ({})", member, ec.message()));
      if (may_resend(path) && ++resent < n_members) continue;
      throw ConnectionError(
          fmt::format("etcd at {} broke the connection during {}: {}", member, path, ec.message()));
    }
    if (res.keep_alive()) impl_->give_back(std::move(conn));
    if (res.result() != http::status::ok) {
      GatewayError e = decode_error(res.body());
      if (cannot_serve_now(e)) {
        // Not a refusal of this request: etcd cannot serve right now. Callers retry
        // ConnectionError (an election takes a second or two); another member may serve now.
        impl_->failed(member_index, fmt::format("{} cannot serve now ({})", member, e.message));
        if (may_resend(path) && ++resent < n_members) continue;
        throw ConnectionError(fmt::format(
            "etcd at {} cannot serve {} now: {} (gRPC code {}: no leader, a leader change, no "
            "quorum, or the member is stopping)",
            member, path, e.message, e.code));
      }
      throw_status(member, path, res.result_int(), res.body());
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
  std::unique_ptr<Connection> conn;
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
    error_code ec = run_op(conn->ioc, conn->socket, deadline, [&](auto handler) {
      http::async_read_some(conn->socket, conn->buffer, parser, handler);
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
  impl_->conn->socket.close(ignored);
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
  asio::post(impl_->conn->ioc, [impl = impl_.get()] {
    error_code ignored;
    impl->conn->socket.close(ignored);
  });
}

std::unique_ptr<Watch> Client::watch(const std::string& key, const std::string& range_end,
                                     int64_t start_revision) {
  note("watches opened");
  // Opening a watch changes nothing in etcd: when a member breaks the request, the next is asked.
  for (size_t tried = 1;; ++tried) {
    auto impl = std::make_unique<Watch::Impl>();
    impl->parser.body_limit(boost::none);  // a watch stream has no end
    impl->conn = impl_->open();
    const size_t member_index = impl->conn->member;
    const std::string member = impl_->members[member_index].to_string();
    impl->endpoint = member;
    const TimePoint deadline = steady_clock().now() + impl_->options.request_timeout;
    auto req =
        make_request(member, "/v3/watch", encode_watch_create(key, range_end, start_revision));
    error_code ec = run_op(impl->conn->ioc, impl->conn->socket, deadline, [&](auto handler) {
      http::async_write(impl->conn->socket, req, handler);
    });
    if (!ec) {
      ec = run_op(impl->conn->ioc, impl->conn->socket, deadline, [&](auto handler) {
        http::async_read_header(impl->conn->socket, impl->conn->buffer, impl->parser, handler);
      });
    }
    if (ec) {
      const bool timed_out = ec == asio::error::timed_out;
      impl_->failed(member_index,
                    timed_out ? fmt::format("{} did not open a watch in time", member)
                              : fmt::format("{} broke a watch request ({})", member, ec.message()));
      if (tried < impl_->members.size()) continue;
      if (timed_out) {
        throw TimeoutError(fmt::format("etcd at {} did not open a watch within {:.1f} s", member,
                                       to_seconds(impl_->options.request_timeout)));
      }
      throw ConnectionError(
          fmt::format("etcd at {} broke the watch request: {}", member, ec.message()));
    }
    if (impl->parser.get().result() != http::status::ok) {
      while (!impl->parser.is_done() && impl->read_more(deadline)) {
      }
      throw_status(member, "/v3/watch", impl->parser.get().result_int(), impl->pending);
    }
    // The first message confirms the watch ({"result":{"created":true}}); events may follow in
    // the same read.
    while (!impl->take_lines()) {
      if (!impl->read_more(deadline)) {
        throw TimeoutError(fmt::format("etcd at {} did not confirm a watch within {:.1f} s", member,
                                       to_seconds(impl_->options.request_timeout)));
      }
    }
    return std::unique_ptr<Watch>(new Watch(std::move(impl)));
  }
}

}  // namespace dlaunch::etcd
