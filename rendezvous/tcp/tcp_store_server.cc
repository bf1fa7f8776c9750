#include "rendezvous/tcp/tcp_store_server.h"

#include <fmt/format.h>

#include <sys/resource.h>

#include <cerrno>

#include <boost/asio.hpp>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "rendezvous/tcp/tcp_store_connection.h"

namespace dlaunch {

namespace asio = boost::asio;
using asio::ip::tcp;

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

// The listener and its thread. Connections and what they share are the manager's
// (tcp_store_connection.h); what a request does to the store is TcpStoreState's.
struct TcpStoreServer::Impl {
  explicit Impl(TcpStoreServerOptions o)
      : options(std::move(o)), acceptor(ctx), retry_timer(ctx), manager(ctx, options) {}

  TcpStoreServerOptions options;
  // One thread runs this context: the hint lets Asio skip its internal locking.
  asio::io_context ctx{1};
  tcp::acceptor acceptor;
  asio::steady_timer retry_timer;
  TcpStoreConnectionManager manager;  // touched only on the server thread (but size())
  std::thread thread;
  std::mutex lifecycle_mutex;
  bool started = false;
  bool stopped = false;
  uint16_t bound_port = 0;

  void accept_next() {
    acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket sock) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {
        // Out of descriptors (EMFILE/ENFILE) or a transient error: back off briefly rather
        // than spin on a listener that stays readable.
        manager.complain("accept failed: " + ec.message() + "; retrying in 50 ms");
        retry_timer.expires_after(std::chrono::milliseconds(50));
        retry_timer.async_wait([this](const boost::system::error_code& e) {
          if (!e) accept_next();
        });
        return;
      }
      manager.start(std::move(sock));
      accept_next();
    });
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
      throw UsageError(fmt::format(
          "store server: cannot resolve the bind address '{}': {}; pass an IP address of this "
          "machine",
          o.host, ec.message()));
    }
    address = results.begin()->endpoint().address();
  }
  tcp::endpoint endpoint(address, o.port);
  std::string where = (address.is_v6() ? "[" + address.to_string() + "]" : address.to_string()) +
                      ":" + std::to_string(o.port);
  auto& acc = impl_->acceptor;
  acc.open(endpoint.protocol(), ec);
  if (ec) {
    throw SystemError(
        fmt::format("store server: cannot open a socket for {}: {}", where, ec.message()));
  }
  acc.set_option(tcp::acceptor::reuse_address(true), ec);
  acc.bind(endpoint, ec);
  if (ec == asio::error::address_in_use) {
    throw AddressInUseError(fmt::format(
        "store server: port {} on {} is already in use by another process (another job or a "
        "stale agent); pick another port, or 0 to let dlaunch choose one",
        o.port, address.to_string()));
  }
  if (ec.value() == EADDRNOTAVAIL) {
    throw UsageError(fmt::format(
        "store server: {} is not an address of this machine; pass one of its own addresses "
        "(--local_addr) to bind the store",
        address.to_string()));
  }
  if (ec) throw SystemError(fmt::format("store server: cannot bind {}: {}", where, ec.message()));
  acc.listen(o.backlog, ec);
  if (ec) {
    throw SystemError(fmt::format("store server: cannot listen on {}: {}", where, ec.message()));
  }
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
    impl->manager.stop_all();
    impl->ctx.stop();
  });
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint16_t TcpStoreServer::port() const { return impl_->bound_port; }
const std::string& TcpStoreServer::host() const { return impl_->options.host; }
size_t TcpStoreServer::num_connections() const {
  return impl_->manager.size();
}

namespace {

// Runs `f` on the server's thread and waits for its result (or its exception). `f` owns what
// it uses: after a timeout it may still run.
template <typename F>
auto on_server_thread(asio::io_context& ctx, bool running, F f) -> decltype(f()) {
  if (!running) throw ClosedError("store server: not running");
  auto task = std::make_shared<std::packaged_task<decltype(f())()>>(std::move(f));
  auto result = task->get_future();
  asio::post(ctx, [task]() { (*task)(); });
  if (result.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    throw ClosedError("store server: no answer from its thread within 5 s");
  }
  return result.get();
}

}  // namespace

int64_t TcpStoreServer::add_local(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(impl_->lifecycle_mutex);
  return on_server_thread(impl_->ctx, impl_->started && !impl_->stopped,
                          [impl = impl_.get(), key, delta]() {
                            int64_t v = impl->manager.state.local_add(key, delta);
                            impl->manager.stats.note_keys(impl->manager.state.num_keys());
                            return v;
                          });
}

void TcpStoreServer::set_local(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> lock(impl_->lifecycle_mutex);
  on_server_thread(impl_->ctx, impl_->started && !impl_->stopped,
                   [impl = impl_.get(), key, value]() {
                     impl->manager.state.local_set(key, value);
                     impl->manager.stats.note_keys(impl->manager.state.num_keys());
                   });
}

void TcpStoreServer::begin_worker_namespace_local(const std::string& ns) {
  std::lock_guard<std::mutex> lock(impl_->lifecycle_mutex);
  on_server_thread(impl_->ctx, impl_->started && !impl_->stopped, [impl = impl_.get(), ns]() {
    impl->manager.state.local_begin_worker_namespace(ns);
    impl->manager.stats.note_keys(impl->manager.state.num_keys());
  });
}

StoreStatsSnapshot TcpStoreServer::stats() const {
  StoreStatsSnapshot s = impl_->manager.stats.snapshot();
  s.connections = static_cast<int64_t>(impl_->manager.size());
  s.connections_peak = static_cast<int64_t>(impl_->manager.peak());
  s.connections_accepted = impl_->manager.accepted();
  s.channels_opened = impl_->manager.channels_opened();
  return s;
}

}  // namespace dlaunch
