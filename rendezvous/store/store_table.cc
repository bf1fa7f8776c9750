#include "rendezvous/store/store_table.h"

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
    throw ProtocolError(fmt::format(
        "store key '{}' holds '{}', expected a decimal counter written by add(); do not mix "
        "set() and add() on one key",
        key, to_string(value)));
  }
  return result;
}

int64_t add_to_counter(const Bytes* current, int64_t delta, const std::string& key) {
  if (!current) return delta;
  int64_t base = parse_counter(*current, key);
  int64_t sum = 0;
  if (__builtin_add_overflow(base, delta, &sum)) {
    throw ProtocolError(fmt::format(
        "add({}) to store key '{}' holding {} leaves the int64 range; reset the counter or add "
        "smaller steps",
        delta, key, base));
  }
  return sum;
}

template <typename Modify>
void StoreTable::update(const std::string& key, Modify modify) {
  auto [it, created] = table_.try_emplace(key);
  if (!observer_) {
    modify(it->second);
  } else if (observer_->wants_old_value(key)) {
    Bytes old = it->second;
    modify(it->second);
    observer_->changed(key, created, &old, it->second);
  } else {
    modify(it->second);
    observer_->changed(key, created, nullptr, it->second);
  }
}

const Bytes* StoreTable::find(const std::string& key) const {
  auto it = table_.find(key);
  return it == table_.end() ? nullptr : &it->second;
}

void StoreTable::set(const std::string& key, const Bytes& value) {
  update(key, [&](Bytes& v) { v = value; });
}

void StoreTable::exchange(const std::string& key, Bytes& value) {
  update(key, [&](Bytes& v) { v.swap(value); });
}

int64_t StoreTable::add(const std::string& key, int64_t delta) {
  int64_t sum = add_to_counter(find(key), delta, key);
  // Rewrite the digits in place: no allocation per ADD.
  char digits[24];
  auto written = std::to_chars(digits, digits + sizeof(digits), sum);
  update(key, [&](Bytes& v) { v.assign(digits, written.ptr); });
  return sum;
}

const Bytes& StoreTable::compare_set(const std::string& key, const Bytes& expected,
                                     const Bytes& desired) {
  auto it = table_.find(key);
  if (it == table_.end()) {
    if (!expected.empty()) return expected;  // c10d's answer for a missing key
    update(key, [&](Bytes& v) { v = desired; });
  } else if (it->second == expected) {
    update(key, [&](Bytes& v) { v = desired; });
  }
  return table_.find(key)->second;
}

void StoreTable::append(const std::string& key, const Bytes& tail) {
  update(key, [&](Bytes& v) { v.insert(v.end(), tail.begin(), tail.end()); });
}

bool StoreTable::erase(const std::string& key) {
  auto it = table_.find(key);
  if (it == table_.end()) return false;
  Bytes old = std::move(it->second);
  table_.erase(it);
  if (observer_) observer_->erased(key, old);
  return true;
}

int64_t StoreTable::erase_prefix(const std::string& prefix) {
  int64_t n = 0;
  for (auto it = table_.begin(); it != table_.end();) {
    if (it->first.compare(0, prefix.size(), prefix) == 0) {
      it = table_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

}  // namespace dlaunch
