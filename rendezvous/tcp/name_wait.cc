#include "rendezvous/tcp/name_wait.h"

#include <netdb.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/tcp/wait_notes.h"

namespace dlaunch {

int name_lookup_code(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found) ::freeaddrinfo(found);
  return rc;
}

std::string name_lookup_error(const std::string& host) {
  const int rc = name_lookup_code(host);
  return rc == 0 ? "" : ::gai_strerror(rc);
}

std::string unresolved_name_advice(const std::string& host) {
  return fmt::format(
      "check that '{}' is the master's name on every node and that the master is up (on "
      "Kubernetes: its pod is running, and this is its headless service's name, as `getent "
      "hosts {}` in a pod shows), or give it longer with --rdzv_conf join_timeout=SECONDS",
      host, host);
}

void wait_until_name_resolves(const std::string& host, Duration patience,
                              const std::string& role) {
  const auto started = std::chrono::steady_clock::now();
  std::string error = name_lookup_error(host);
  if (error.empty()) return;
  WaitNotes notes(started);
  int64_t lookups = 1;
  while (true) {
    const auto now = std::chrono::steady_clock::now();
    if (now - started >= patience) break;
    if (notes.due(now)) {
      log_info("'{}' does not resolve yet ({}); looking it up again every {:g} s, {}; {}", host,
               error, to_seconds(kNameRetryInterval), notes.how_long(now, patience), role);
    }
    std::this_thread::sleep_for(std::min<Duration>(kNameRetryInterval, patience - (now - started)));
    error = name_lookup_error(host);
    ++lookups;
    if (error.empty()) {
      log_info("'{}' resolves now, after {:.1f} s", host,
               to_seconds(std::chrono::steady_clock::now() - started));
      return;
    }
  }
  throw ConnectionError(fmt::format(
      "'{}' did not resolve within {:g} s (the join timeout; {} lookups, the resolver's last "
      "answer: {}); {}; {}",
      host, to_seconds(patience), lookups, error, role, unresolved_name_advice(host)));
}

}  // namespace dlaunch
