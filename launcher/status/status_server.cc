#include "launcher/status/status_server.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <optional>
#include <set>

#include "common/error.h"
#include "common/log.h"

namespace dlaunch {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr size_t kMaxRequestBytes = 64 * 1024;
constexpr auto kRequestTimeout = std::chrono::seconds(10);
constexpr size_t kMaxConnections = 64;

std::string endpoint_text(const tcp::endpoint& ep) {
  auto a = ep.address();
  return (a.is_v6() ? "[" + a.to_string() + "]" : a.to_string()) + ":" + std::to_string(ep.port());
}

class Session;

// What sessions share with the server; they hold it, not the server, so a session still
// finishing after the server is gone touches nothing freed.
struct Shared {
  HttpHandler handler;
  std::set<std::weak_ptr<Session>, std::owner_less<std::weak_ptr<Session>>> sessions;
  bool stopped = false;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<Shared> shared)
      : stream_(std::move(socket)), shared_(std::move(shared)) {
    boost::system::error_code ec;
    auto ep = stream_.socket().remote_endpoint(ec);
    peer_ = ec ? "?" : endpoint_text(ep);
  }

  void start() { read_next(); }

  void close() {
    boost::system::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

 private:
  void read_next() {
    parser_.emplace();
    parser_->body_limit(kMaxRequestBytes);
    parser_->header_limit(16 * 1024);
    stream_.expires_after(kRequestTimeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec) return finish();  // closed, timed out, too large or malformed: drop it
    const auto& req = parser_->get();
    HttpRequest r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    for (const auto& field : req) {
      std::string name(field.name_string());
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.headers[name] = std::string(field.value());
    }
    r.body = req.body();
    r.peer = peer_;
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    stream_.expires_never();  // a deferred answer (a stack dump) may take a while
    auto self = shared_from_this();
    bool answered = false;
    try {
      shared_->handler(r, [self, answered](HttpResponse resp) mutable {
        if (answered) return;
        answered = true;
        self->write(std::move(resp));
      });
    } catch (const std::exception& e) {
      log_warning("status endpoint: {} {} failed: {}", r.method, r.target, e.what());
      write(HttpResponse{500, "text/plain", std::string("internal error: ") + e.what() + "\n"});
    }
  }

  void write(HttpResponse resp) {
    if (shared_->stopped) return;
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(resp.status), version_);
    res->set(http::field::server, "dlaunch");
    res->set(http::field::content_type, resp.content_type);
    res->keep_alive(keep_alive_);
    res->body() = std::move(resp.body);
    res->prepare_payload();
    stream_.expires_after(kRequestTimeout);
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res](beast::error_code ec, size_t) {
                        if (ec || !res->keep_alive()) return self->finish();
                        self->read_next();
                      });
  }

  void finish() {
    close();
    shared_->sessions.erase(weak_from_this());
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<Shared> shared_;
  std::string peer_;
  bool keep_alive_ = false;
  unsigned version_ = 11;
};

}  // namespace

std::string HttpRequest::path() const {
  return target.substr(0, target.find('?'));
}

std::string HttpRequest::query(const std::string& name) const {
  size_t q = target.find('?');
  if (q == std::string::npos) return "";
  std::string rest = target.substr(q + 1);
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t amp = rest.find('&', pos);
    std::string pair = rest.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
    size_t eq = pair.find('=');
    if (pair.substr(0, eq) == name) return eq == std::string::npos ? "" : pair.substr(eq + 1);
    if (amp == std::string::npos) break;
    pos = amp + 1;
  }
  return "";
}

struct StatusServer::Impl {
  Impl(asio::io_context& io, HttpHandler handler)
      : acceptor(io), shared(std::make_shared<Shared>()) {
    shared->handler = std::move(handler);
  }
  tcp::acceptor acceptor;
  std::shared_ptr<Shared> shared;
  std::string address;

  void accept_next(const std::shared_ptr<Impl>& self) {
    std::weak_ptr<Impl> weak = self;
    acceptor.async_accept([weak](const boost::system::error_code& ec, tcp::socket sock) {
      auto impl = weak.lock();
      if (!impl || ec == asio::error::operation_aborted || !impl->acceptor.is_open()) return;
      if (!ec) {
        if (impl->shared->sessions.size() >= kMaxConnections) {
          boost::system::error_code ignored;
          sock.close(ignored);
        } else {
          auto s = std::make_shared<Session>(std::move(sock), impl->shared);
          impl->shared->sessions.insert(s);
          s->start();
        }
      }
      impl->accept_next(impl);
    });
  }
};

StatusServer::StatusServer(asio::io_context& io, HttpHandler handler)
    : impl_(std::make_shared<Impl>(io, std::move(handler))) {}

StatusServer::~StatusServer() {
  stop();
}

uint16_t StatusServer::start(const std::string& host, uint16_t port) {
  boost::system::error_code ec;
  auto address = asio::ip::make_address(host, ec);
  if (ec) {
    tcp::resolver resolver(impl_->acceptor.get_executor());
    auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::numeric_service, ec);
    if (ec || results.empty()) {
      throw UsageError("status endpoint: cannot resolve the address '" + host +
                       "' to bind; pass an IP address of this machine with --status_addr");
    }
    address = results.begin()->endpoint().address();
  }
  tcp::endpoint endpoint(address, port);
  auto& acc = impl_->acceptor;
  acc.open(endpoint.protocol(), ec);
  if (!ec) acc.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acc.bind(endpoint, ec);
  if (ec.value() == EADDRNOTAVAIL) {
    throw UsageError("status endpoint: " + address.to_string() +
                     " is not an address of this machine; pass one of its own with "
                     "--status_addr (or --status_port -1 to serve no endpoint)");
  }
  if (!ec) acc.listen(64, ec);
  if (ec) {
    boost::system::error_code ignored;
    acc.close(ignored);
    throw SystemError("status endpoint: cannot listen on " + endpoint_text(endpoint) + ": " +
                      ec.message() + "; pick another --status_port (0: a free one)");
  }
  auto bound = acc.local_endpoint();
  impl_->address = endpoint_text(bound);
  impl_->accept_next(impl_);
  return bound.port();
}

void StatusServer::stop() {
  if (impl_->shared->stopped) return;
  impl_->shared->stopped = true;
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
  auto sessions = impl_->shared->sessions;
  for (const auto& weak : sessions) {
    if (auto s = weak.lock()) s->close();
  }
  impl_->shared->sessions.clear();
}

std::string StatusServer::address() const {
  return impl_->address;
}

bool is_loopback_peer(const std::string& peer) {
  std::string host = peer.substr(0, peer.rfind(':'));
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  boost::system::error_code ec;
  auto a = asio::ip::make_address(host, ec);
  if (ec) return false;
  if (a.is_v6() && a.to_v6().is_v4_mapped()) {
    return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6()).is_loopback();
  }
  return a.is_loopback();
}

}  // namespace dlaunch
