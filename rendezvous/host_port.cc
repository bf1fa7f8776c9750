#include "rendezvous/host_port.h"

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
      throw UsageError(what + ": '" + text + "' opens '[' without ']'; write [v6addr]:port");
    }
    hp.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') {
        throw UsageError(what + ": expected ':' after ']' in '" + text + "'");
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
    throw UsageError(what + ": no host in '" + text + "'; expected host:port");
  }
  if (!port_text.empty()) {
    int64_t port = parse_int(port_text, what + " port");
    if (port < 0 || port > 65535) {
      throw UsageError(what + ": port " + port_text + " is outside 0-65535");
    }
    hp.port = static_cast<uint16_t>(port);
  }
  return hp;
}

}  // namespace dlaunch
