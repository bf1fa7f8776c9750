#include "bench/rendezvous/sim_workers.h"

#include <fmt/format.h>

#include "common/error.h"

namespace dlaunch::sim {
namespace {

constexpr size_t kUniqueIdBytes = 128;  // sizeof(ncclUniqueId)
constexpr auto kInitTimeout = std::chrono::seconds(600);

}  // namespace

int64_t NcclInitModel::roots() const {
  if (world <= ranks_per_root) return 1;
  return (world + ranks_per_root - 1) / ranks_per_root;
}

std::string NcclInitModel::id_key(int64_t i) const {
  // The default group's prefix store: "default_pg" / group "0" / device "cuda", each joined
  // with '/' and the client's leading '/'.
  if (roots() == 1) return "/default_pg/0//cuda//0/nccl_storekey_0";
  return fmt::format("/default_pg/0//cuda//0/nccl_storekey_0_{}", i);
}

std::vector<std::string> NcclInitModel::id_keys() const {
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(roots()));
  for (int64_t i = 0; i < roots(); ++i) keys.push_back(id_key(i));
  return keys;
}

void run_worker_init(Store& store, const NcclInitModel& model, int64_t rank) {
  store.connect();
  store.add("init/", 1);
  if (rank % model.ranks_per_root == 0 && rank / model.ranks_per_root < model.roots()) {
    Bytes id(kUniqueIdBytes, static_cast<uint8_t>(rank / model.ranks_per_root));
    store.set(model.id_key(rank / model.ranks_per_root), id);
  }
  const auto keys = model.id_keys();
  store.wait(keys, kInitTimeout);
  store.wait(keys, kInitTimeout);
  auto ids = store.multi_get(keys);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i].size() != kUniqueIdBytes) {
      throw StateError(fmt::format("rank {}: id {} has {} bytes, expected {}", rank, i,
                                   ids[i].size(), kUniqueIdBytes));
    }
  }
}

}  // namespace dlaunch::sim
