#include "rendezvous/tcp/worker_namespace.h"

#include <fmt/format.h>

#include "rendezvous/store/store.h"

namespace dlaunch {

std::string worker_namespace(const std::string& run_id, int64_t round) {
  return fmt::format("dlaunch/workers/{}/round_{}/", run_id, round);
}

bool begin_worker_namespace(Store& store, const std::string& ns) {
  if (!store.can_delete_prefix()) return false;
  if (store.check({kWorkerNamespaceKey})) {
    std::string old = to_string(store.get(kWorkerNamespaceKey));
    if (!old.empty() && old != ns) store.delete_prefix(old);
  }
  store.set(kWorkerNamespaceKey, to_bytes(ns));
  return true;
}

}  // namespace dlaunch
