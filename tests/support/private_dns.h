// A real DNS server on loopback that only this test process (and what it starts) asks: the
// process moves into a network and mount namespace of its own (unshare), brings `lo` up, starts
// Debian's dnsmasq on 127.0.0.1:53, answering only for names it was given (NXDOMAIN for the
// rest of its domain, as a Kubernetes headless service's name is before its pod is up), and
// bind-mounts a resolv.conf naming that server (and an nsswitch.conf that asks DNS after
// /etc/hosts) over the host's. Records change by rewriting dnsmasq's hosts file and SIGHUP.
//
// Root only, and the process must still be single-threaded when it enters (unshare of the
// mount namespace refuses a threaded process): create it first in a test. ctest runs each test
// in a process of its own, so the namespaces end with the test; the host's network and files
// are never touched. Blocks only to start the server and to wait for a record to be served.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

#include "tests/support/subprocess.h"

namespace dlaunch::testing {

class PrivateDns {
 public:
  // The reason this machine cannot run one (not root, no dnsmasq, no namespaces); "" when it can.
  static std::string unavailable();

  // Enters the namespaces and starts the server for names under `domain` ("dlaunch.test").
  // Throws std::runtime_error when a step fails.
  explicit PrivateDns(const std::string& domain);
  ~PrivateDns();  // stops the server (the namespaces go with the process)
  PrivateDns(const PrivateDns&) = delete;
  PrivateDns& operator=(const PrivateDns&) = delete;

  // Makes `name` resolve to `address` (replacing what it resolved to), and returns once a
  // lookup from this process gets that address: the moment the record is visible.
  std::chrono::steady_clock::time_point publish(const std::string& name,
                                                const std::string& address);

 private:
  void reload();

  TempDir dir_;
  std::string records_;
  pid_t server_ = -1;
};

// The addresses `name` resolves to now, space-separated; "" when it does not resolve.
std::string resolve_now(const std::string& name);

}  // namespace dlaunch::testing
