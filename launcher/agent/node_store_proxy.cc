#include "launcher/agent/node_store_proxy.h"

#include "common/error.h"
#include "common/log.h"

namespace dlaunch {

RendezvousResult NodeStoreProxy::route(const RendezvousResult& r) {
  if (!enabled_) return r;
  const bool same_store = proxy_ && r.master_addr == store_addr_ && r.master_port == store_port_;
  if (!same_store || !proxy_->connected()) {
    proxy_.reset();  // a proxy that lost its store has closed its workers already
    StoreProxyOptions o;
    o.store_host = r.master_addr;
    o.store_port = static_cast<uint16_t>(r.master_port);
    o.token = token_;
    try {
      auto proxy = std::make_unique<StoreProxy>(o);
      const uint16_t port = proxy->start();
      proxy_ = std::move(proxy);
      store_addr_ = r.master_addr;
      store_port_ = r.master_port;
      log_info("store proxy: this node's workers reach the job's store at {}:{} through "
               "127.0.0.1:{}, over one connection (--store_proxy)",
               r.master_addr, r.master_port, port);
    } catch (const Error& e) {
      log_warning("{}; this node's workers connect to the store directly", e.what());
      return r;
    }
  }
  RendezvousResult routed = r;
  routed.master_addr = "127.0.0.1";
  routed.master_port = proxy_->port();
  return routed;
}

}  // namespace dlaunch
