// A Store held in this process's memory: the reference implementation every other Store is
// tested against, and the backing table of single-process tests.
//
// Thread-safe (one mutex); get()/wait() block on a condition variable until the keys exist or
// the timeout passes (TimeoutError naming the missing keys). Never throws ConnectionError.
// The table and its set/add/compare_set semantics are StoreTable's, shared with the TCP store
// server, so the reference and the server cannot disagree.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "rendezvous/store/store.h"
#include "rendezvous/store/store_table.h"  // also parse_counter, add_to_counter

namespace dlaunch {

class InMemoryStore final : public Store {
 public:
  InMemoryStore() = default;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;

 private:
  // Blocks (lock held by `lock`) until every key exists or `timeout` passes.
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   Duration timeout);
  bool has_all_locked(const std::vector<std::string>& keys) const;

  std::mutex mutex_;
  std::condition_variable changed_;
  StoreTable table_;
};

}  // namespace dlaunch
