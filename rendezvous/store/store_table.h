// The key-value table behind every store that keeps its own keys (the in-memory store, the
// TCP store server's state): set, add, compare_set, append and delete with c10d's semantics,
// written once so the two cannot drift apart.
//
// Not thread-safe and never blocks: the owner serialises calls (InMemoryStore under its mutex,
// the server on its one thread) and does its own waiting. An optional Observer hears of every
// change, so the server can tell watchers and wake waiters without a second lookup.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "rendezvous/store/store.h"

namespace dlaunch {

// Parses a counter value as add() stores it ("-12"); throws ProtocolError on anything else.
int64_t parse_counter(const Bytes& value, const std::string& key);

// add()'s arithmetic, shared by every store that keeps counters itself: `current` (null when
// the key is missing) plus `delta`. Throws ProtocolError when the value is not a counter or the
// sum leaves int64 (signed overflow would be undefined behaviour a client could trigger).
int64_t add_to_counter(const Bytes* current, int64_t delta, const std::string& key);

class StoreTable {
 public:
  // Hears of each change as it happens, on the caller's thread. Must not call back into the
  // table while being told (the server only queues replies). Never throws.
  class Observer {
   public:
    virtual ~Observer() = default;
    // Whether changes to `key` need the old value (someone watches it): only then is it
    // copied, so unwatched writes cost no allocation.
    virtual bool wants_old_value(const std::string& key) const = 0;
    // `key` was created or changed to `now`; `old` is its previous value when
    // wants_old_value(key) said so (empty for a created key), else null.
    virtual void changed(const std::string& key, bool created, const Bytes* old,
                         const Bytes& now) = 0;
    // `key` was removed by erase() (not by erase_prefix, as c10d's server).
    virtual void erased(const std::string& key, const Bytes& old) = 0;
  };

  explicit StoreTable(Observer* observer = nullptr) : observer_(observer) {}

  // The value at `key`, or null. The pointer lives until the next change to the table.
  const Bytes* find(const std::string& key) const;
  bool contains(const std::string& key) const { return table_.count(key) > 0; }
  size_t size() const { return table_.size(); }
  // Calls f(key) for every key, in no particular order.
  template <typename F>
  void for_each_key(F f) const {
    for (const auto& entry : table_) f(entry.first);
  }

  void set(const std::string& key, const Bytes& value);
  // set() that stores `value`'s buffer and hands the old one back in `value`, for a caller
  // that reuses it (the server's decoder): no allocation per SET.
  void exchange(const std::string& key, Bytes& value);
  // Store::add: throws ProtocolError (see add_to_counter) and leaves the value as it was.
  int64_t add(const std::string& key, int64_t delta);
  // Store::compare_set: returns the value now stored, or `expected` for a missing key with a
  // non-empty `expected` (c10d's answer). The reference lives until the next change.
  const Bytes& compare_set(const std::string& key, const Bytes& expected, const Bytes& desired);
  // Appends `tail` to the value (created empty if missing).
  void append(const std::string& key, const Bytes& tail);
  // Removes `key`; returns whether it existed.
  bool erase(const std::string& key);
  // Removes every key starting with `prefix` (observers are not told); returns how many.
  // Linear in the table size.
  int64_t erase_prefix(const std::string& prefix);
  // Drops every value without telling the observer.
  void clear() { table_.clear(); }

 private:
  // Changes the value at `key` (created empty if missing) in place with modify(Bytes&) and
  // tells the observer.
  template <typename Modify>
  void update(const std::string& key, Modify modify);

  Observer* observer_;
  std::unordered_map<std::string, Bytes> table_;
};

}  // namespace dlaunch
