#include "rendezvous/tcp_store_server.h"

#include <sys/resource.h>

#include <cerrno>

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_set>

#include "common/log.h"
#include "rendezvous/job_token.h"
#include "rendezvous/sha256.h"
#include "rendezvous/tcp_store_state.h"

namespace dlaunch {

namespace asio = boost::asio;
using asio::ip::tcp;
using wire::Op;
using wire::Request;

namespace {

// Raises the soft open-file limit to the hard one, so one server can hold 10,000+ sockets.
void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    rlim_t old = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &lim) == 0) {
      log_debug("store server: raised the open-file limit from {} to {}", old, lim.rlim_max);
    }
  }
}

}  // namespace

// The connection side of the server: accepting, reading and writing, framing, dialect
// detection and the job token. What a request does to the store is TcpStoreState's.
struct TcpStoreServer::Impl {
  struct Conn;
  using ConnPtr = std::shared_ptr<Conn>;

  // One client connection. Touched only on the server thread. Its replies collect in `out`
  // (StoreSession's), written by flush().
  struct Conn final : StoreSession {
    Conn(Impl& s, tcp::socket sock) : srv(s), socket(std::move(sock)) {}

    ConnPtr self() { return std::static_pointer_cast<Conn>(shared_from_this()); }
    void replied() override { srv.replied(self()); }
    void resumed() override { srv.post_process(self()); }

    Impl& srv;
    tcp::socket socket;
    std::string peer;         // "addr:port", for logs
    asio::ip::address peer_address;
    Bytes in;                 // received bytes; [in_begin, in.size()) not yet decoded
    Bytes rbuf;               // the buffer of the pending read
    size_t in_begin = 0;
    Bytes out_writing;
    bool writing = false;
    bool reading = false;
    bool in_process = false;  // inside process(): replies collect in `out`, one write
    bool dialect_known = false;
    wire::Dialect dialect = wire::Dialect::kTorch113;
    // Job token state.
    bool authenticated = false;
    bool admitted = false;  // allowed to use the store (authenticated, or no token needed)
    bool auth_begun = false;
    wire::Digest client_nonce{}, server_nonce{};
    bool process_posted = false;
  };

  explicit Impl(TcpStoreServerOptions o) : options(std::move(o)), acceptor(ctx), retry_timer(ctx) {}

  TcpStoreServerOptions options;
  // One thread runs this context: the hint lets Asio skip its internal locking.
  asio::io_context ctx{1};
  tcp::acceptor acceptor;
  asio::steady_timer retry_timer;
  std::thread thread;
  std::mutex lifecycle_mutex;
  bool started = false;
  bool stopped = false;
  uint16_t bound_port = 0;
  std::atomic<size_t> open_connections{0};

  // Decoded requests land here, reused (no allocation per request for short keys).
  Request scratch;

  // The store, touched only on the server thread.
  TcpStoreState state;
  std::unordered_set<ConnPtr> connections;
  std::set<asio::ip::address> agent_hosts;  // peers that proved the token

  // Rate-limited logging of refused and malformed clients.
  std::chrono::steady_clock::time_point last_complaint{};
  size_t suppressed_complaints = 0;

  void complain(const std::string& message) {
    auto now = std::chrono::steady_clock::now();
    if (now - last_complaint < std::chrono::seconds(1)) {
      ++suppressed_complaints;
      return;
    }
    last_complaint = now;
    if (suppressed_complaints > 0) {
      log_warning("store server: {} ({} similar messages suppressed)", message,
                  suppressed_complaints);
      suppressed_complaints = 0;
    } else {
      log_warning("store server: {}", message);
    }
  }

  // ---- accept -----------------------------------------------------------------------------

  void accept_next() {
    acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket sock) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {
        // Out of descriptors (EMFILE/ENFILE) or a transient error: back off briefly rather
        // than spin on a listener that stays readable.
        complain("accept failed: " + ec.message() + "; retrying in 50 ms");
        retry_timer.expires_after(std::chrono::milliseconds(50));
        retry_timer.async_wait([this](const boost::system::error_code& e) {
          if (!e) accept_next();
        });
        return;
      }
      boost::system::error_code ignore;
      sock.set_option(tcp::no_delay(true), ignore);
      auto conn = std::make_shared<Conn>(*this, std::move(sock));
      auto ep = conn->socket.remote_endpoint(ignore);
      conn->peer_address = ep.address();
      conn->peer = ep.address().is_v6() ? "[" + ep.address().to_string() + "]:" +
                                              std::to_string(ep.port())
                                        : ep.address().to_string() + ":" + std::to_string(ep.port());
      conn->admitted = !options.token.has_value();
      connections.insert(conn);
      open_connections.store(connections.size(), std::memory_order_relaxed);
      start_read(conn);
      accept_next();
    });
  }

  // ---- I/O --------------------------------------------------------------------------------

  void start_read(const ConnPtr& c) {
    if (c->closed || c->reading) return;
    // A parked client may send CANCEL_WAIT, so keep reading, but do not buffer without bound.
    if (c->in.size() - c->in_begin > options.limits.max_frame_bytes) {
      complain("client " + c->peer + " sent more than a frame while blocked; closing it");
      close(c);
      return;
    }
    // Read into a separate buffer: process() may run (posted) while this read is pending.
    size_t chunk = c->in.size() - c->in_begin > 4096 ? 65536 : 4096;
    if (c->rbuf.size() != chunk) c->rbuf.resize(chunk);
    c->reading = true;
    c->socket.async_read_some(
        asio::buffer(c->rbuf.data(), chunk),
        [this, c](const boost::system::error_code& ec, size_t n) {
          c->reading = false;
          if (c->closed) return;
          if (ec) {
            close(c);
            return;
          }
          if (c->in.empty()) {
            // The common case: nothing pending. Swap buffers instead of copying.
            c->rbuf.resize(n);
            c->in.swap(c->rbuf);
          } else {
            c->in.insert(c->in.end(), c->rbuf.begin(),
                         c->rbuf.begin() + static_cast<std::ptrdiff_t>(n));
          }
          process(c);
          start_read(c);
        });
  }

  // Replies are appended to c->out in place, then replied(c) is called: it writes at
  // once, or at the end of process() when c is being processed, so all the replies to one
  // read go out in one write.
  void replied(const ConnPtr& c) {
    if (c->closed) {
      c->out.clear();
      return;
    }
    // A client that sends requests but never reads the replies must not grow our memory.
    if (c->out.size() > options.limits.max_frame_bytes) {
      complain("client " + c->peer + " does not read its replies; closing it");
      close(c);
      return;
    }
    if (!c->in_process) flush(c);
  }

  void send(const ConnPtr& c, const Bytes& bytes) {
    if (c->closed) return;
    c->out.insert(c->out.end(), bytes.begin(), bytes.end());
    replied(c);
  }

  void flush(const ConnPtr& c) {
    if (c->writing || c->out.empty() || c->closed) return;
    c->out_writing.swap(c->out);
    c->out.clear();
    c->writing = true;
    asio::async_write(c->socket, asio::buffer(c->out_writing),
                      [this, c](const boost::system::error_code& ec, size_t) {
                        c->writing = false;
                        c->out_writing.clear();
                        // Keep small buffers for the next replies, not a big one's memory
                        // (10,000 connections x one large MULTI_GET each would add up).
                        if (c->out_writing.capacity() > (1u << 20)) Bytes().swap(c->out_writing);
                        if (ec) {
                          close(c);
                          return;
                        }
                        flush(c);
                      });
  }

  void close(const ConnPtr& c) {
    if (c->closed) return;
    c->closed = true;
    if (c->auth_begun && !c->authenticated) {  // a client checks our proof first, then leaves
      note_job_token_refusal();
      complain("refused client " + c->peer + ": " +
               (options.token ? "its job token differs from this store's"
                              : "it has a job token, this store none") +
               " (give every node the same DLAUNCH_JOB_TOKEN)");
    }
    state.drop(*c);
    boost::system::error_code ignore;
    c->socket.shutdown(tcp::socket::shutdown_both, ignore);
    c->socket.close(ignore);
    c->out.clear();
    connections.erase(c);
    open_connections.store(connections.size(), std::memory_order_relaxed);
  }

  void bad_frame(const ConnPtr& c, const std::string& why) {
    complain("closing client " + c->peer + ": " + why);
    close(c);
  }

  // ---- decoding ---------------------------------------------------------------------------

  void process(const ConnPtr& c) {
    c->in_process = true;
    process_frames(c);
    c->in_process = false;
    if (!c->closed) flush(c);
    // Compact the input buffer.
    if (c->in_begin > 0) {
      c->in.erase(c->in.begin(), c->in.begin() + static_cast<std::ptrdiff_t>(c->in_begin));
      c->in_begin = 0;
      if (c->in.empty() && c->in.capacity() > 65536) Bytes().swap(c->in);
    }
  }

  // Decodes and handles every complete frame in c->in.
  void process_frames(const ConnPtr& c) {
    Request& q = scratch;
    while (!c->closed) {
      const uint8_t* data = c->in.data() + c->in_begin;
      size_t size = c->in.size() - c->in_begin;
      if (!c->dialect_known) {
        auto d = wire::detect_dialect(data, size, options.limits);
        if (d.status == wire::Status::kNeedMore) break;
        if (d.status == wire::Status::kBad) return bad_frame(c, d.error);
        c->dialect_known = true;
        c->dialect = d.dialect;
        c->in_begin += d.consumed;
        continue;
      }
      auto r = wire::decode_request(c->dialect, data, size, options.limits, &q);
      if (r.status == wire::Status::kNeedMore) break;
      if (r.status == wire::Status::kBad) return bad_frame(c, r.error);
      if (c->parked()) {
        // Only CANCEL_WAIT may overtake a parked request; anything else waits its turn.
        if (q.op != Op::kCancelWait) break;
        c->in_begin += r.consumed;
        state.cancel_wait(*c);
        replied(c);
        continue;
      }
      c->in_begin += r.consumed;
      handle(c, q);
    }
  }

  // Resume decoding a connection after its parked request completed; posted, so a set that
  // wakes many clients does not recurse into their handlers.
  void post_process(const ConnPtr& c) {
    if (c->process_posted) return;
    c->process_posted = true;
    asio::post(ctx, [this, c] {
      c->process_posted = false;
      if (c->closed) return;
      process(c);
      start_read(c);
    });
  }

  // ---- requests -------------------------------------------------------------------------

  bool handle_auth(const ConnPtr& c, const Request& q) {
    if (q.op == Op::kAuthBegin) {
      if (c->dialect != wire::Dialect::kTorch2 || c->auth_begun) {
        bad_frame(c, "unexpected AUTH_BEGIN");
        return true;
      }
      c->auth_begun = true;
      c->client_nonce = q.digest;
      Bytes reply;
      if (!options.token) {
        wire::put_u8(reply, 0);
        wire::Digest zero{};
        wire::put_raw(reply, zero.data(), zero.size());
        wire::put_raw(reply, zero.data(), zero.size());
      } else {
        c->server_nonce = random_nonce();
        auto proof = server_proof(*options.token, c->client_nonce, c->server_nonce);
        wire::put_u8(reply, 1);
        wire::put_raw(reply, c->server_nonce.data(), c->server_nonce.size());
        wire::put_raw(reply, proof.data(), proof.size());
      }
      send(c, std::move(reply));
      return true;
    }
    if (q.op == Op::kAuthProof) {
      if (!c->auth_begun || !options.token || c->authenticated) {
        bad_frame(c, "unexpected AUTH_PROOF");
        return true;
      }
      auto expected = client_proof(*options.token, c->client_nonce, c->server_nonce);
      if (!constant_time_equal(expected.data(), q.digest.data(), expected.size())) {
        complain("refused client " + c->peer + ": wrong job token (check DLAUNCH_JOB_TOKEN)");
        c->auth_begun = false;  // logged
        note_job_token_refusal();
        close(c);
        return true;
      }
      c->authenticated = true;
      c->admitted = true;
      agent_hosts.insert(c->peer_address);
      Bytes reply;
      wire::put_u8(reply, 0);
      send(c, std::move(reply));
      return true;
    }
    return false;
  }

  // `q` is the reused scratch request: handlers may take its buffers.
  void handle(const ConnPtr& c, Request& q) {
    if (q.op == Op::kAuthBegin || q.op == Op::kAuthProof) {
      handle_auth(c, q);
      return;
    }
    if (!c->admitted) {
      if (options.admit_unauthenticated_from_agent_hosts && agent_hosts.count(c->peer_address)) {
        c->admitted = true;
      } else {
        complain("refused client " + c->peer + " (" + wire::op_name(q.op) +
                 "): this store requires the job token and the client did not prove it" +
                 (options.admit_unauthenticated_from_agent_hosts
                      ? " (nor does it connect from an agent's host)"
                      : ""));
        close(c);
        return;
      }
    }
    std::string error;
    switch (state.handle(*c, q, error)) {
      case TcpStoreState::Handled::kReplied:
        return replied(c);
      case TcpStoreState::Handled::kQuiet:
        return;
      case TcpStoreState::Handled::kBadRequest:
        return bad_frame(c, error);
    }
  }
};

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

TcpStoreServer::~TcpStoreServer() { stop(); }

uint16_t TcpStoreServer::start() {
  std::lock_guard<std::mutex> lock(impl_->lifecycle_mutex);
  DL_CHECK(!impl_->started) << "TcpStoreServer::start called twice";
  auto& o = impl_->options;
  raise_fd_limit();

  boost::system::error_code ec;
  auto address = asio::ip::make_address(o.host, ec);
  if (ec) {
    // A name: resolve it forward (never reverse) and bind its first address.
    tcp::resolver resolver(impl_->ctx);
    auto results = resolver.resolve(o.host, std::to_string(o.port),
                                    tcp::resolver::numeric_service, ec);
    if (ec || results.empty()) {
      throw UsageError("store server: cannot resolve the bind address '" + o.host +
                       "': " + ec.message() + "; pass an IP address of this machine");
    }
    address = results.begin()->endpoint().address();
  }
  tcp::endpoint endpoint(address, o.port);
  std::string where = (address.is_v6() ? "[" + address.to_string() + "]" : address.to_string()) +
                      ":" + std::to_string(o.port);
  auto& acc = impl_->acceptor;
  acc.open(endpoint.protocol(), ec);
  if (ec) throw SystemError("store server: cannot open a socket for " + where + ": " + ec.message());
  acc.set_option(tcp::acceptor::reuse_address(true), ec);
  acc.bind(endpoint, ec);
  if (ec == asio::error::address_in_use) {
    throw AddressInUseError("store server: port " + std::to_string(o.port) + " on " +
                            address.to_string() +
                            " is already in use by another process (another job or a stale "
                            "agent); pick another port, or 0 to let dlaunch choose one");
  }
  if (ec.value() == EADDRNOTAVAIL) {
    throw UsageError("store server: " + address.to_string() +
                     " is not an address of this machine; pass one of its own addresses "
                     "(--local_addr) to bind the store");
  }
  if (ec) throw SystemError("store server: cannot bind " + where + ": " + ec.message());
  acc.listen(o.backlog, ec);
  if (ec) throw SystemError("store server: cannot listen on " + where + ": " + ec.message());
  impl_->bound_port = acc.local_endpoint().port();
  impl_->started = true;
  impl_->accept_next();
  impl_->thread = std::thread([impl = impl_.get()] {
    try {
      impl->ctx.run();
    } catch (const std::exception& e) {
      log_error("store server thread stopped on an unexpected error: {}", e.what());
    }
  });
  log_debug("store server listening on {}:{}", address.to_string(), impl_->bound_port);
  return impl_->bound_port;
}

void TcpStoreServer::stop() {
  std::lock_guard<std::mutex> lock(impl_->lifecycle_mutex);
  if (!impl_->started || impl_->stopped) return;
  impl_->stopped = true;
  asio::post(impl_->ctx, [impl = impl_.get()] {
    boost::system::error_code ignore;
    impl->acceptor.close(ignore);
    impl->retry_timer.cancel();
    auto conns = impl->connections;
    for (auto& c : conns) impl->close(c);
    impl->state.forget_clients();
    impl->ctx.stop();
  });
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint16_t TcpStoreServer::port() const { return impl_->bound_port; }
const std::string& TcpStoreServer::host() const { return impl_->options.host; }
size_t TcpStoreServer::num_connections() const {
  return impl_->open_connections.load(std::memory_order_relaxed);
}

}  // namespace dlaunch
