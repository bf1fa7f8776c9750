#include "rendezvous/in_memory_store.h"

#include <fmt/format.h>

#include <charconv>

#include "common/error.h"

namespace dlaunch {

int64_t parse_counter(const Bytes& value, const std::string& key) {
  int64_t result = 0;
  const char* begin = reinterpret_cast<const char*>(value.data());
  const char* end = begin + value.size();
  auto [ptr, ec] = std::from_chars(begin, end, result);
  if (value.empty() || ec != std::errc() || ptr != end) {
    throw ProtocolError("store key '" + key + "' holds '" + to_string(value) +
                        "', expected a decimal counter written by add(); do not mix set() and "
                        "add() on one key");
  }
  return result;
}

int64_t add_to_counter(const Bytes* current, int64_t delta, const std::string& key) {
  if (!current) return delta;
  int64_t base = parse_counter(*current, key);
  int64_t sum = 0;
  if (__builtin_add_overflow(base, delta, &sum)) {
    throw ProtocolError("add(" + std::to_string(delta) + ") to store key '" + key +
                        "' holding " + std::to_string(base) +
                        " leaves the int64 range; reset the counter or add smaller steps");
  }
  return sum;
}

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
    if (table_.find(k) == table_.end()) return false;
  }
  return true;
}

void InMemoryStore::wait_locked(std::unique_lock<std::mutex>& lock,
                                const std::vector<std::string>& keys, Duration timeout) {
  // Saturating, as the TCP client's deadline: a "forever" timeout (Duration::max()) must not
  // overflow into a deadline in the past.
  auto now = std::chrono::steady_clock::now();
  auto deadline = timeout > TimePoint::max() - now ? TimePoint::max() : now + timeout;
  if (!changed_.wait_until(lock, deadline, [&] { return has_all_locked(keys); })) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (table_.find(k) == table_.end()) missing.push_back(k);
    }
    throw TimeoutError("in-memory store: waited " + fmt::format("{:g}", to_seconds(timeout)) +
                       " s for key(s) " + join_keys(missing) + " that nobody set");
  }
}

void InMemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    table_[key] = value;
  }
  changed_.notify_all();
}

Bytes InMemoryStore::get(const std::string& key) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock, {key}, timeout());
  return table_.at(key);
}

int64_t InMemoryStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = table_.find(key);
    result = add_to_counter(it == table_.end() ? nullptr : &it->second, delta, key);
    table_[key] = to_bytes(std::to_string(result));
  }
  changed_.notify_all();
  return result;
}

Bytes InMemoryStore::compare_set(const std::string& key, const Bytes& expected,
                                 const Bytes& desired) {
  Bytes result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = table_.find(key);
    if (it == table_.end()) {
      if (!expected.empty()) return expected;  // c10d's answer for a missing key
      table_[key] = desired;
      result = desired;
    } else {
      if (it->second == expected) it->second = desired;
      result = it->second;
    }
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
  return table_.erase(key) > 0;
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
  for (const auto& k : keys) values.push_back(table_.at(k));
  return values;
}

void InMemoryStore::multi_set(const std::vector<std::string>& keys,
                              const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) Store::multi_set(keys, values);  // throws the usage error
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < keys.size(); ++i) table_[keys[i]] = values[i];
  }
  changed_.notify_all();
}

}  // namespace dlaunch
