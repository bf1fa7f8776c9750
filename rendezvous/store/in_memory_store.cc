#include "rendezvous/store/in_memory_store.h"

#include <fmt/format.h>

#include "common/error.h"

namespace dlaunch {

namespace {

std::string join_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) {
    if (!out.empty()) out += ", ";
    out += "'" + k + "'";
  }
  return out;
}

}  // namespace

bool InMemoryStore::has_all_locked(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (!table_.contains(k)) return false;
  }
  return true;
}

void InMemoryStore::wait_locked(std::unique_lock<std::mutex>& lock,
                                const std::vector<std::string>& keys, Duration timeout) {
  auto deadline = deadline_after(timeout);
  if (!changed_.wait_until(lock, deadline, [&] { return has_all_locked(keys); })) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (!table_.contains(k)) missing.push_back(k);
    }
    throw TimeoutError(fmt::format("in-memory store: waited {:g} s for key(s) {} that nobody set",
                                   to_seconds(timeout), join_keys(missing)));
  }
}

void InMemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    table_.set(key, value);
  }
  changed_.notify_all();
}

Bytes InMemoryStore::get(const std::string& key) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock, {key}, timeout());
  return *table_.find(key);
}

int64_t InMemoryStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    result = table_.add(key, delta);
  }
  changed_.notify_all();
  return result;
}

Bytes InMemoryStore::compare_set(const std::string& key, const Bytes& expected,
                                 const Bytes& desired) {
  Bytes result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    result = table_.compare_set(key, expected, desired);
  }
  changed_.notify_all();
  return result;
}

bool InMemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return has_all_locked(keys);
}

void InMemoryStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock, keys, timeout);
}

bool InMemoryStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_.erase(key);
}

int64_t InMemoryStore::num_keys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(table_.size());
}

std::vector<Bytes> InMemoryStore::multi_get(const std::vector<std::string>& keys) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock, keys, timeout());
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& k : keys) values.push_back(*table_.find(k));
  return values;
}

void InMemoryStore::multi_set(const std::vector<std::string>& keys,
                              const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) Store::multi_set(keys, values);  // throws the usage error
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < keys.size(); ++i) table_.set(keys[i], values[i]);
  }
  changed_.notify_all();
}

}  // namespace dlaunch
