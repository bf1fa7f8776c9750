// A master name that resolves late. On Kubernetes the master is a headless service's DNS name,
// which fails to resolve (NXDOMAIN; EAI_AGAIN while the DNS server cannot say) until the
// master's pod is up, and may resolve to another address once that pod is replaced. So dlaunch
// looks such a name up again until its join timeout instead of failing at once, says so at
// growing intervals (WaitNotes: 5, 10, 20, 40... s, one line each, never a stack of errors),
// and resolves it anew at every connect (tcp_store_client.cc, etcd_client.cc), never keeping
// an address it got once.
#pragma once

#include <string>

#include "common/clock.h"

namespace dlaunch {

// How often a name that does not resolve is looked up again: often enough that a job forms
// within a second after its master's name appears. Each failed lookup costs the DNS server one
// query per search domain (answers it caches), four times a second per waiting node.
inline constexpr Duration kNameRetryInterval = std::chrono::milliseconds(250);

// getaddrinfo's code for `host`: 0 when it resolves (an IP literal does at once), else EAI_*
// (EAI_NONAME: no such name; EAI_AGAIN: the DNS server did not answer). One forward lookup;
// blocks for as long as the resolver takes (seconds when the DNS server does not answer).
int name_lookup_code(const std::string& host);
// The same as the resolver's message: "" when it resolves, else e.g. "Name or service not
// known". Never throws.
std::string name_lookup_error(const std::string& host);

// What to do about a name that never resolved: the last part of every such error.
std::string unresolved_name_advice(const std::string& host);

// Blocks until `host` resolves, looking it up every kNameRetryInterval for up to `patience`
// (the join timeout). `role` says why this node needs the name ("this node (node rank 0) hosts
// the job's store there"), in the notes and the error. Returns at once when it resolves.
// Throws ConnectionError when `patience` passes: the name, the resolver's last answer, `role`
// and what to do. A lookup that blocks may overrun `patience` by the resolver's own timeout.
void wait_until_name_resolves(const std::string& host, Duration patience,
                              const std::string& role);

}  // namespace dlaunch
