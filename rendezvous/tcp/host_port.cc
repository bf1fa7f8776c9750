#include "rendezvous/tcp/host_port.h"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/env.h"
#include "common/error.h"

namespace dlaunch {

bool is_ipv6_literal(const std::string& host) { return host.find(':') != std::string::npos; }

std::string HostPort::to_string() const {
  if (is_ipv6_literal(host)) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

HostPort parse_host_port(const std::string& text, uint16_t default_port, const std::string& what) {
  HostPort hp;
  hp.port = default_port;
  std::string port_text;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos) {
      throw UsageError(
          fmt::format("{}: '{}' opens '[' without ']'; write [v6addr]:port", what, text));
    }
    hp.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') {
        throw UsageError(fmt::format("{}: expected ':' after ']' in '{}'", what, text));
      }
      port_text = text.substr(close + 2);
    }
  } else {
    size_t colon = text.rfind(':');
    if (colon != std::string::npos && text.find(':') != colon) {
      // Several colons and no brackets: a bare IPv6 address, no port.
      hp.host = text;
    } else if (colon != std::string::npos) {
      hp.host = text.substr(0, colon);
      port_text = text.substr(colon + 1);
    } else {
      hp.host = text;
    }
  }
  if (hp.host.empty()) {
    throw UsageError(fmt::format("{}: no host in '{}'; expected host:port", what, text));
  }
  if (!port_text.empty()) {
    int64_t port = parse_int(port_text, fmt::format("{} port", what));
    if (port < 0 || port > 65535) {
      throw UsageError(fmt::format("{}: port {} is outside 0-65535", what, port_text));
    }
    hp.port = static_cast<uint16_t>(port);
  }
  return hp;
}

std::string local_address_towards(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  std::string port_text = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found); rc != 0) {
    throw ConnectionError(fmt::format(
        "cannot resolve '{}' to find this host's address towards it: {}", host,
        ::gai_strerror(rc)));
  }
  std::string reason = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      ::close(fd);
      ::freeaddrinfo(found);
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw = local.ss_family == AF_INET6
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      ::inet_ntop(local.ss_family, raw, text, sizeof text);
      return text;
    }
    reason = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  throw ConnectionError(fmt::format(
      "no route from this host to '{}' ({}); check the network, or set GLOO_SOCKET_IFNAME to the "
      "interface to use",
      host, reason));
}

}  // namespace dlaunch
