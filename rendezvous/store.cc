#include "rendezvous/store.h"

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
    throw UsageError("Store::multi_set: expected as many values as keys, got " +
                     std::to_string(keys.size()) + " keys and " + std::to_string(values.size()) +
                     " values");
  }
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

}  // namespace dlaunch
