#include "rendezvous/store/prefix_store.h"

#include "common/error.h"

namespace dlaunch {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  DL_CHECK(base_ != nullptr) << "PrefixStore needs a base store";
  set_timeout(base_->timeout());
}

std::vector<std::string> PrefixStore::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(full(k));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) { base_->set(full(key), value); }

Bytes PrefixStore::get(const std::string& key) {
  // The base's get() would use the base's timeout; wait with ours first. When the key exists the
  // wait answers at once.
  if (timeout() != base_->timeout()) base_->wait({full(key)}, timeout());
  return base_->get(full(key));
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(full(key), delta);
}

Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return base_->compare_set(full(key), expected, desired);
}

bool PrefixStore::check(const std::vector<std::string>& keys) { return base_->check(full(keys)); }

void PrefixStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  base_->wait(full(keys), timeout);
}

bool PrefixStore::delete_key(const std::string& key) { return base_->delete_key(full(key)); }

int64_t PrefixStore::delete_prefix(const std::string& prefix) {
  return base_->delete_prefix(full(prefix));
}

int64_t PrefixStore::num_keys() { return base_->num_keys(); }

std::vector<Bytes> PrefixStore::multi_get(const std::vector<std::string>& keys) {
  auto full_keys = full(keys);
  if (timeout() != base_->timeout()) base_->wait(full_keys, timeout());
  return base_->multi_get(full_keys);
}

void PrefixStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<Bytes>& values) {
  base_->multi_set(full(keys), values);
}

WaitGetResult PrefixStore::wait_get(const std::vector<std::string>& keys, Duration timeout) {
  return base_->wait_get(full(keys), timeout);
}

}  // namespace dlaunch
