// This node's store proxy (--store_proxy, rendezvous/proxy/store_proxy.h), as the agent runs
// it: started for the store a round names, before that round's workers, and their
// MASTER_ADDR/MASTER_PORT pointed at it (127.0.0.1 and its port), so the node's workers share
// one connection to the job's store. Kept from one generation to the next while the store stays
// where it was and the proxy still reaches it (restarted workers reconnect to the same one);
// made anew otherwise. Loop thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "rendezvous/handlers/rendezvous_handler.h"
#include "rendezvous/proxy/store_proxy.h"

namespace dlaunch {

class NodeStoreProxy {
 public:
  // `enabled` false: route() returns the round as it is.
  NodeStoreProxy(bool enabled, std::optional<std::string> job_token)
      : enabled_(enabled), token_(std::move(job_token)) {}

  // The round as this node's workers should see it: its store's address replaced by the
  // proxy's. When the proxy cannot start (logged, with why), the workers reach the store
  // directly, as with --store_proxy off. Blocks while the proxy connects (the store answered
  // this agent's rendezvous just before, so briefly). Never throws.
  RendezvousResult route(const RendezvousResult& r);

 private:
  bool enabled_;
  std::optional<std::string> token_;
  std::unique_ptr<StoreProxy> proxy_;
  std::string store_addr_;
  int64_t store_port_ = 0;
};

}  // namespace dlaunch
