#include "rendezvous/etcd/etcd_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <optional>
#include <thread>

#include "common/error.h"
#include "rendezvous/store/store_table.h"

namespace dlaunch {
namespace {

// etcd refuses transactions with more than --max-txn-ops (default 128) operations.
constexpr size_t kMaxOpsPerTxn = 100;

std::string as_string(const Bytes& b) {
  return std::string(b.begin(), b.end());
}
Bytes as_bytes(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

}  // namespace

// One watch on one key, from the moment it is created: a thread reads its events and keeps the
// latest put (revision and value); waiters block on a condition variable. When the stream
// breaks (etcd gone), waiters are woken with the error and the next wait starts a new watch.
// Once a read found the key missing, the watch knows it stays missing until a put: later waits
// on it read nothing (the rendezvous' event watcher waits in 1 s slices: one range a second
// per agent before).
class EtcdStore::KeyWatch {
 public:
  KeyWatch(etcd::Client& client, const std::string& key) {
    // From now (start revision 0): a put made after the caller's range (which follows this
    // confirmed watch) is an event here; one made before is in the range's answer.
    watch_ = client.watch(key, "", 0);
    thread_ = std::thread([this] { run(); });
  }

  ~KeyWatch() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    watch_->cancel();
    thread_.join();
  }

  bool broken() {
    std::lock_guard<std::mutex> lock(mutex_);
    return !error_.empty();
  }

  // The revision as of which the key is known to be missing (read so, or deleted, and no put
  // seen since), or nullopt.
  std::optional<int64_t> missing_as_of() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_.empty() || put_) return std::nullopt;
    return missing_;
  }
  // A read of the key at `revision` found it missing (this watch was open before the read).
  void note_missing(int64_t revision) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!put_ && (!missing_ || *missing_ < revision)) missing_ = revision;
  }

  // Blocks until a put of the key newer than `after` was seen (returns its value), `deadline`
  // passes (nullopt), the watch broke (ConnectionError) or interrupt() was called meanwhile
  // (StoreInterruptedError). `key` names the key in the interruption's message.
  std::optional<std::string> wait_put(const std::string& key, int64_t after, TimePoint deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t interrupts_at_start = interrupts_;
    while (true) {
      if (put_ && put_->revision > after) return put_->value;
      if (!error_.empty()) throw ConnectionError(error_);
      if (interrupts_ != interrupts_at_start) {
        throw StoreInterruptedError(fmt::format(
            "etcd store: the wait for key '{}' was interrupted by another thread", key));
      }
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
        if (put_ && put_->revision > after) return put_->value;
        return std::nullopt;
      }
    }
  }

  // Ends every wait_put in progress (a counter, so waits that start later are not affected).
  void interrupt() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++interrupts_;
    }
    changed_.notify_all();
  }

 private:
  struct Put {
    int64_t revision = 0;
    std::string value;
  };

  void run() {
    try {
      while (true) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (stopping_) return;
        }
        auto message = watch_->next(steady_clock().now() + std::chrono::milliseconds(500));
        if (!message) continue;
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto& event : message->events) {
          if (event.type == etcd::Event::Type::kPut) {
            put_ = Put{event.kv.mod_revision, std::move(event.kv.value)};
            missing_.reset();
          } else {
            put_.reset();
            missing_ = event.kv.mod_revision;  // the delete's revision
          }
        }
        changed_.notify_all();
      }
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = e.what();
      changed_.notify_all();
    }
  }

  std::unique_ptr<etcd::Watch> watch_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;    // guarded by mutex_
  uint64_t interrupts_ = 0;  // guarded by mutex_
  std::string error_;        // guarded by mutex_
  std::optional<Put> put_;   // guarded by mutex_
  std::optional<int64_t> missing_;  // guarded by mutex_; see missing_as_of()
};

EtcdStore::EtcdStore(std::shared_ptr<etcd::Client> client, std::string prefix)
    : client_(std::move(client)), prefix_(std::move(prefix)) {
  DL_CHECK(client_ != nullptr);
}

EtcdStore::~EtcdStore() = default;

std::shared_ptr<EtcdStore::KeyWatch> EtcdStore::key_watch(const std::string& full_key) {
  std::shared_ptr<KeyWatch> stale;  // destroyed (thread joined) after the lock is released
  std::vector<std::shared_ptr<KeyWatch>> evicted;
  std::lock_guard<std::mutex> lock(watch_mutex_);
  auto it = watches_.find(full_key);
  if (it != watches_.end() && it->second.watch->broken()) {
    stale = std::move(it->second.watch);
    watches_.erase(it);
    it = watches_.end();
  }
  if (it == watches_.end()) {
    // Room for the new one: drop the least recently used watches nobody waits on.
    while (watches_.size() >= kMaxKeyWatches) {
      auto oldest = watches_.end();
      for (auto w = watches_.begin(); w != watches_.end(); ++w) {
        if (w->second.watch.use_count() == 1 &&
            (oldest == watches_.end() || w->second.last_use < oldest->second.last_use)) {
          oldest = w;
        }
      }
      if (oldest == watches_.end()) break;  // all in use: go above the bound for a while
      evicted.push_back(std::move(oldest->second.watch));
      watches_.erase(oldest);
    }
    it = watches_.emplace(full_key, Watched{std::make_shared<KeyWatch>(*client_, full_key), 0})
             .first;
  }
  it->second.last_use = ++uses_;
  return it->second.watch;
}

void EtcdStore::interrupt() {
  std::lock_guard<std::mutex> lock(watch_mutex_);
  for (auto& [key, w] : watches_) w.watch->interrupt();
}

void EtcdStore::set(const std::string& key, const Bytes& value) {
  client_->put(full(key), as_string(value));
}

void EtcdStore::set_with_lease(const std::string& key, const Bytes& value, int64_t lease) {
  client_->put(full(key), as_string(value), lease);
}

std::string EtcdStore::wait_one(const std::string& key, TimePoint deadline, Duration waited_for) {
  const std::string k = full(key);
  // The watch first: it then sees every put after the range below (no gap).
  auto watch = key_watch(k);
  std::optional<int64_t> after = watch->missing_as_of();
  if (!after) {
    auto current = client_->range(k);
    if (!current.kvs.empty()) return std::move(current.kvs.front().value);
    watch->note_missing(current.revision);
    after = current.revision;
  }
  auto value = watch->wait_put(k, *after, deadline);
  if (!value) {
    throw TimeoutError(fmt::format(
        "etcd store at {}: key '{}' did not appear within {:.1f} s; the agent or worker that "
        "should set it may have failed or not started",
        client_->endpoint(), k, to_seconds(waited_for)));
  }
  return std::move(*value);
}

Bytes EtcdStore::get(const std::string& key) {
  const Duration t = timeout();
  return as_bytes(wait_one(key, steady_clock().now() + t, t));
}

void EtcdStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  // Several keys: one transaction answers the common "all there" case. One key: wait_one's
  // range does that already.
  if (keys.size() > 1 && check(keys)) return;
  const TimePoint deadline = steady_clock().now() + timeout;
  for (const auto& key : keys) wait_one(key, deadline, timeout);
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  const std::string k = full(key);
  std::optional<etcd::KeyValue> current = client_->get(k);
  while (true) {
    // The same arithmetic and refusals (not a counter, int64 overflow) as every other store.
    Bytes stored = current ? to_bytes(current->value) : Bytes();
    const int64_t next = add_to_counter(current ? &stored : nullptr, delta, k);
    // add(k, 0) is how callers read a counter without blocking (the rendezvous polls it):
    // answer from the read instead of writing the same value back, which would cost an etcd
    // raft write and fsync per poll. Only a missing key is written, to create it at 0.
    if (delta == 0 && current) return next;
    auto guard = current ? etcd::Compare::mod_revision_equals(k, current->mod_revision)
                         : etcd::Compare::missing(k);
    auto t = client_->txn({guard}, {etcd::Op::put(k, std::to_string(next))}, {etcd::Op::get(k)});
    if (t.succeeded) return next;
    etcd::note("failed compare-and-swap txns");
    // Someone else changed it in between: retry from the value the failed txn read.
    current.reset();
    if (!t.responses.empty() && !t.responses[0].range.kvs.empty()) {
      current = std::move(t.responses[0].range.kvs.front());
    }
  }
}

Bytes EtcdStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const std::string k = full(key);
  const std::string want = as_string(expected);
  std::optional<etcd::KeyValue> current = client_->get(k);
  while (true) {
    if (!current) {
      // c10d: a missing key matches only an empty `expected`; otherwise `expected` comes back.
      if (!want.empty()) return expected;
    } else if (current->value != want) {
      return as_bytes(current->value);
    }
    auto guard = current ? etcd::Compare::mod_revision_equals(k, current->mod_revision)
                         : etcd::Compare::missing(k);
    auto t = client_->txn({guard}, {etcd::Op::put(k, as_string(desired))}, {etcd::Op::get(k)});
    if (t.succeeded) return desired;
    etcd::note("failed compare-and-swap txns");
    current.reset();
    if (!t.responses.empty() && !t.responses[0].range.kvs.empty()) {
      current = std::move(t.responses[0].range.kvs.front());
    }
  }
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  for (size_t start = 0; start < keys.size(); start += kMaxOpsPerTxn) {
    std::vector<etcd::Op> ops;
    for (size_t i = start; i < std::min(keys.size(), start + kMaxOpsPerTxn); ++i) {
      auto op = etcd::Op::get(full(keys[i]));
      op.count_only = true;
      ops.push_back(std::move(op));
    }
    auto t = client_->txn({}, ops, {});
    for (const auto& r : t.responses) {
      if (r.range.count == 0) return false;
    }
  }
  return true;
}

bool EtcdStore::delete_key(const std::string& key) {
  return client_->delete_range(full(key)) > 0;
}

int64_t EtcdStore::num_keys() {
  return client_->range(prefix_, etcd::prefix_end(prefix_), /*count_only=*/true).count;
}

std::vector<Bytes> EtcdStore::multi_get(const std::vector<std::string>& keys) {
  const Duration t = timeout();
  const TimePoint deadline = steady_clock().now() + t;
  std::vector<Bytes> values(keys.size());
  for (size_t start = 0; start < keys.size(); start += kMaxOpsPerTxn) {
    const size_t end = std::min(keys.size(), start + kMaxOpsPerTxn);
    std::vector<etcd::Op> ops;
    for (size_t i = start; i < end; ++i) ops.push_back(etcd::Op::get(full(keys[i])));
    auto txn = client_->txn({}, ops, {});
    for (size_t i = start; i < end; ++i) {
      const auto& kvs = txn.responses.at(i - start).range.kvs;
      values[i] =
          kvs.empty() ? as_bytes(wait_one(keys[i], deadline, t)) : as_bytes(kvs.front().value);
    }
  }
  return values;
}

void EtcdStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) {
    throw UsageError(
        fmt::format("Store::multi_set: expected as many values as keys, got {} keys "
                    "and {} values",
                    keys.size(), values.size()));
  }
  for (size_t start = 0; start < keys.size(); start += kMaxOpsPerTxn) {
    std::vector<etcd::Op> ops;
    for (size_t i = start; i < std::min(keys.size(), start + kMaxOpsPerTxn); ++i) {
      ops.push_back(etcd::Op::put(full(keys[i]), as_string(values[i])));
    }
    client_->txn({}, ops, {});
  }
}

}  // namespace dlaunch
