#include "rendezvous/store/store.h"

#include <fmt/format.h>

#include "common/error.h"

namespace dlaunch {

// Default multi-key operations: one call per key. Backends with a batched wire operation (the
// TCP client) override these to save round trips.
std::vector<Bytes> Store::multi_get(const std::vector<std::string>& keys) {
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(get(key));
  return values;
}

void Store::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) {
    throw UsageError(fmt::format(
        "Store::multi_set: expected as many values as keys, got {} keys and {} values",
        keys.size(), values.size()));
  }
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

WaitGetResult Store::wait_get(const std::vector<std::string>& keys, Duration timeout) {
  if (keys.empty()) {
    throw UsageError("Store::wait_get: expected at least one key (the first is waited for)");
  }
  WaitGetResult result;
  try {
    wait({keys[0]}, timeout);
    result.ready = true;
  } catch (const TimeoutError&) {
  }
  result.values.reserve(keys.size());
  for (const auto& key : keys) {
    if (check({key})) {
      result.values.emplace_back(get(key));
    } else {
      result.values.emplace_back(std::nullopt);
    }
  }
  return result;
}

int64_t Store::delete_prefix(const std::string& prefix) {
  throw StateError(fmt::format(
      "this store cannot delete keys by prefix ('{}'): only a dlaunch TCP store can; ask "
      "can_delete_prefix() first",
      prefix));
}

}  // namespace dlaunch
