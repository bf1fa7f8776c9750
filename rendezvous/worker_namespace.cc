#include "rendezvous/worker_namespace.h"

#include <fmt/format.h>

#include "rendezvous/tcp_store_client.h"

namespace dlaunch {

std::string worker_namespace(const std::string& run_id, int64_t round) {
  return fmt::format("dlaunch/workers/{}/round_{}/", run_id, round);
}

void begin_worker_namespace(TcpStoreClient& store, const std::string& ns) {
  if (store.check({kWorkerNamespaceKey})) {
    std::string old = to_string(store.get(kWorkerNamespaceKey));
    if (!old.empty() && old != ns) store.delete_prefix(old);
  }
  store.set(kWorkerNamespaceKey, to_bytes(ns));
}

}  // namespace dlaunch
