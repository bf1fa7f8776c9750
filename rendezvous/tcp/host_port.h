// "host:port" endpoints as users write them: "10.0.0.1:29500", "node-a:29500",
// "[fe80::1]:29500", a bare host (default port). No resolution happens here, and none of
// dlaunch does reverse DNS: a name is only ever resolved forward, when connecting or binding.
#pragma once

#include <cstdint>
#include <string>

namespace dlaunch {

struct HostPort {
  std::string host;  // without brackets
  uint16_t port = 0;

  // "host:port", bracketing IPv6 literals.
  std::string to_string() const;
};

// Throws UsageError naming `what` (the flag) on a malformed endpoint or port.
HostPort parse_host_port(const std::string& text, uint16_t default_port, const std::string& what);

// True when `host` is an IPv6 literal (contains ':').
bool is_ipv6_literal(const std::string& host);

// The address of this machine's interface that packets to host:port leave from (the kernel's
// route choice, asked through an unconnected-then-connected UDP socket; nothing is sent). Why:
// a worker must advertise an address its peers on other hosts can reach, and the hostname is
// a poor guess (Debian maps it to 127.0.1.1; network namespaces share it). Resolves `host`
// forward; throws ConnectionError naming host and the reason when there is no route.
std::string local_address_towards(const std::string& host, uint16_t port);

}  // namespace dlaunch
