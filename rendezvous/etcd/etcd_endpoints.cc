#include "rendezvous/etcd/etcd_endpoints.h"

#include <fmt/format.h>

#include "common/error.h"

namespace dlaunch::etcd {
namespace {

std::string expected() {
  return fmt::format(
      "expected host:port of etcd's client URL, or a comma-separated list of them (etcdctl's "
      "form, e.g. 10.0.0.5:{0},10.0.0.6:{0},[fd00::7]:{0})",
      kDefaultClientPort);
}

// One entry without its scheme: "http://h:p/" -> "h:p". Refuses TLS and other schemes.
std::string strip_scheme(const std::string& entry, const std::string& what) {
  std::string rest = entry;
  const size_t scheme_end = rest.find("://");
  if (scheme_end != std::string::npos) {
    const std::string scheme = rest.substr(0, scheme_end);
    if (scheme != "http") {
      throw UsageError(fmt::format(
          "{}: '{}' uses {}://, but dlaunch speaks only plain http:// to etcd (no TLS, no etcd "
          "auth); give the client URL etcd serves over http, or a local proxy in front of it",
          what, entry, scheme));
    }
    rest = rest.substr(scheme_end + 3);
  }
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) {
    throw UsageError(fmt::format("{}: '{}' has a path; {}", what, entry, expected()));
  }
  return rest;
}

}  // namespace

std::string endpoints_needed_message() {
  return fmt::format(
      "--rdzv_backend etcd needs --rdzv_endpoint host:port of etcd's client URL (e.g. "
      "10.0.0.5:{}), or a comma-separated list of the etcd cluster's members",
      kDefaultClientPort);
}

std::vector<HostPort> parse_endpoints(const std::string& text, const std::string& what) {
  if (text.empty()) throw UsageError(fmt::format("{} is empty; {}", what, expected()));
  std::vector<HostPort> result;
  size_t start = 0;
  for (int index = 1;; ++index) {
    const size_t comma = text.find(',', start);
    const std::string entry =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (entry.find_first_not_of(" \t") == std::string::npos) {
      throw UsageError(
          fmt::format("{}: endpoint {} of '{}' is empty; {}", what, index, text, expected()));
    }
    if (entry.find_first_of(" \t") != std::string::npos) {
      throw UsageError(
          fmt::format("{}: endpoint '{}' contains a space; {}", what, entry, expected()));
    }
    // parse_host_port's sentences then name the flag and the entry.
    HostPort hp = parse_host_port(strip_scheme(entry, what), kDefaultClientPort,
                                  fmt::format("{}: endpoint '{}'", what, entry));
    if (hp.port == 0) {
      throw UsageError(fmt::format(
          "{}: endpoint '{}' has port 0; etcd listens on a fixed client port ({} unless its "
          "--listen-client-urls says otherwise): give that port",
          what, entry, kDefaultClientPort));
    }
    result.push_back(std::move(hp));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return result;
}

std::string format_endpoints(const std::vector<HostPort>& endpoints) {
  std::string out;
  for (const auto& hp : endpoints) {
    if (!out.empty()) out += ',';
    out += hp.to_string();
  }
  return out;
}

}  // namespace dlaunch::etcd
