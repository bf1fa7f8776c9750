// rdzv_sim --backend etcd: what the simulator needs to run its agents through the real etcd
// rendezvous (rendezvous/etcd/etcd_rendezvous.h, its ledger and lease liveness, the real etcd
// client) against a real etcd, instead of the c10d handler against a TcpStoreServer.
//
// On the fiber driver the etcd client's calls yield through fiber_asio_hooks.cc (it blocks in
// epoll_wait, not in send/recv/poll). Each simulated etcd agent holds four etcd connections (the
// rendezvous', its round watch, its keep-alive's, and the one its event check uses), each with
// its Asio context's three descriptors: about 16 descriptors per agent, so fewer agents per
// process than with the TCP store (rdzv_sim picks 512).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "rendezvous/handlers/rendezvous_registry.h"

namespace dlaunch::sim {

// An etcd server the simulator talks to: one it started (owned, a fresh data directory per
// start) or one the user named with --etcd_endpoint (pid from --etcd_pid, 0 when not given:
// its CPU and memory are then not measured).
struct EtcdServer {
  pid_t pid = 0;
  std::string endpoint;  // host:port of the client URL
  std::string dir;       // owned only: data directory and log, removed at stop
  bool owned = false;
};

// Starts a private single-member etcd on 127.0.0.1 (free ports, data under /tmp) and waits until
// it answers. Throws UsageError when `etcd` is not installed (scripts/setup.sh --test installs
// etcd-server), SystemError when it does not come up within 30 s (its log's path in the text).
EtcdServer start_etcd_server();
// Stops an owned server (SIGTERM, then SIGKILL after 10 s) and removes its directory; nothing
// for a server the user named.
void stop_etcd_server(EtcdServer& server);

// One simulated agent: the etcd handler (keep-alive driven by the caller), and a check of its
// round's event key (a 1 ms wait on a store of its own, through that store's watch of the key),
// standing in for the agent's event watcher.
struct EtcdSimAgent {
  std::unique_ptr<RendezvousHandler> handler;
  std::function<void()> keep_alive_step;
  std::function<bool(int64_t round)> event_set;
};
// `params` as for c10d, with endpoint = the etcd's and host = a bindable address (group rank 0
// hosts the workers' TCP store on it).
EtcdSimAgent make_etcd_sim_agent(const RendezvousParams& params);

// What this process asked of etcd so far: gateway calls (watch creations included) and the
// watch events it received (etcd::call_counts()).
struct EtcdTraffic {
  int64_t calls = 0;
  int64_t watch_events = 0;
};
EtcdTraffic etcd_traffic();
// This process's etcd calls by gateway path, watch events and other notes (--by-op).
std::map<std::string, int64_t> etcd_calls_by_path();

}  // namespace dlaunch::sim
