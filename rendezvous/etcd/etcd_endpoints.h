// The etcd endpoints of --rdzv_endpoint, in etcdctl's form: one client URL or a comma-separated
// list of them ("10.0.0.5:2379,10.0.0.6:2379,10.0.0.7:2379"), each "host:port" or
// "[v6addr]:port", optionally with "http://" (as etcdctl and etcd's own flags write them) and a
// default port of 2379. A list names members of one etcd cluster: the client talks to one and
// fails over to the next when it stops answering (etcd_client.h).
//
// Parsing only, no resolution (a name is resolved when connecting). Throws UsageError naming
// `what` (the flag), the entry and what to write instead; dlaunch exits 2.
#pragma once

#include <string>
#include <vector>

#include "rendezvous/tcp/host_port.h"

namespace dlaunch::etcd {

constexpr uint16_t kDefaultClientPort = 2379;

// What --rdzv_endpoint must be for --rdzv_backend etcd, said when it is missing.
std::string endpoints_needed_message();

std::vector<HostPort> parse_endpoints(const std::string& text, const std::string& what);

// "host:port,host:port": the canonical spelling of a parsed list (IPv6 bracketed).
std::string format_endpoints(const std::vector<HostPort>& endpoints);

}  // namespace dlaunch::etcd
