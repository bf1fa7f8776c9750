#include "launcher/status/http_client.h"

#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/error.h"
#include "rendezvous/tcp/host_port.h"

namespace dlaunch {

namespace {

using HttpClock = std::chrono::steady_clock;

struct Fd {
  int fd = -1;
  Fd() = default;
  Fd(Fd&& other) noexcept : fd(std::exchange(other.fd, -1)) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void wait_for(int fd, short events, HttpClock::time_point deadline, const std::string& what) {
  pollfd p{fd, events, 0};
  while (true) {
    int ms = remaining_ms(deadline);
    if (ms == 0) throw ConnectionError(what + ": no answer in time");
    int r = ::poll(&p, 1, ms);
    if (r > 0) return;
    if (r < 0 && errno != EINTR) throw ConnectionError(what + ": " + std::strerror(errno));
  }
}

using HttpDeadline = HttpClock::time_point;

// A non-blocking socket connected to `hp` by `deadline`.
Fd connect_to(const HostPort& hp, HttpDeadline deadline, const std::string& what) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  int gai = ::getaddrinfo(hp.host.c_str(), std::to_string(hp.port).c_str(), &hints, &found);
  if (gai != 0 || !found) {
    throw ConnectionError(
        fmt::format("{}: cannot resolve {}: {}", what, hp.host, gai_strerror(gai)));
  }
  Fd sock;
  sock.fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (sock.fd < 0) {
    ::freeaddrinfo(found);
    throw ConnectionError(what + ": socket: " + std::strerror(errno));
  }
  int rc = ::connect(sock.fd, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  if (rc != 0 && errno != EINPROGRESS) {
    throw ConnectionError(what + ": cannot connect: " + std::strerror(errno));
  }
  if (rc != 0) {
    wait_for(sock.fd, POLLOUT, deadline, what);
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(sock.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) throw ConnectionError(what + ": cannot connect: " + std::strerror(err));
  }
  return sock;
}

void send_all(int fd, const std::string& data, HttpDeadline deadline, const std::string& what) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      wait_for(fd, POLLOUT, deadline, what);
    } else {
      throw ConnectionError(what + ": send: " + std::strerror(errno));
    }
  }
}

// The raw answer: until the server closes, or the body has Content-Length bytes. Sets
// `header_end` (the offset of the blank line; npos: none) and `content_length` (npos: none).
std::string receive_answer(int fd, HttpDeadline deadline, const std::string& what,
                           size_t& header_end, size_t& content_length) {
  std::string in;
  char buf[16384];
  header_end = content_length = std::string::npos;
  while (true) {
    if (header_end != std::string::npos && content_length != std::string::npos &&
        in.size() >= header_end + 4 + content_length) {
      break;
    }
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      in.append(buf, static_cast<size_t>(n));
      if (header_end == std::string::npos) {
        header_end = in.find("\r\n\r\n");
        if (header_end != std::string::npos) {
          std::string head = in.substr(0, header_end);
          for (auto& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          size_t cl = head.find("\r\ncontent-length:");
          if (cl != std::string::npos) content_length = std::stoul(head.substr(cl + 17));
        }
      }
    } else if (n == 0) {
      break;
    } else if (errno == EAGAIN || errno == EINTR) {
      wait_for(fd, POLLIN, deadline, what);
    } else {
      throw ConnectionError(what + ": recv: " + std::strerror(errno));
    }
  }
  return in;
}

HttpReply parse_answer(const std::string& in, size_t header_end, size_t content_length,
                       const std::string& what) {
  if (in.empty()) {
    throw ConnectionError(what + ": the connection closed before an answer (the server ended?)");
  }
  if (header_end == std::string::npos || in.compare(0, 5, "HTTP/") != 0) {
    throw ProtocolError(what + ": the answer is not HTTP");
  }
  HttpReply reply;
  size_t sp = in.find(' ');
  reply.status = std::atoi(in.c_str() + sp + 1);
  size_t pos = in.find("\r\n") + 2;
  while (pos < header_end) {
    size_t eol = in.find("\r\n", pos);
    std::string line = in.substr(pos, eol - pos);
    size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t v = line.find_first_not_of(' ', colon + 1);
      reply.headers[name] = v == std::string::npos ? "" : line.substr(v);
    }
    pos = eol + 2;
  }
  reply.body = in.substr(header_end + 4);
  if (content_length != std::string::npos && reply.body.size() > content_length) {
    reply.body.resize(content_length);
  }
  return reply;
}

}  // namespace

HttpReply http_request(const std::string& address, const std::string& method,
                       const std::string& target, const std::map<std::string, std::string>& headers,
                       const std::string& body, Duration timeout) {
  const auto deadline = HttpClock::now() + std::chrono::duration_cast<HttpClock::duration>(timeout);
  HostPort hp = parse_host_port(address, 80, "address");
  const std::string what = fmt::format("{} {}", method, "http://" + address + target);
  Fd sock = connect_to(hp, deadline, what);
  std::string req =
      fmt::format("{} {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", method, target, address);
  for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  req += fmt::format("Content-Length: {}\r\n\r\n", body.size()) + body;
  send_all(sock.fd, req, deadline, what);
  size_t header_end = std::string::npos;
  size_t content_length = std::string::npos;
  std::string in = receive_answer(sock.fd, deadline, what, header_end, content_length);
  return parse_answer(in, header_end, content_length, what);
}

}  // namespace dlaunch
