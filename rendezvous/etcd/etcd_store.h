// dlaunch::Store on etcd v3 (through its JSON gateway): every key lives under one prefix (one
// per run id, e.g. "/dlaunch/<run_id>/"), so jobs sharing an etcd never see each other.
//
//   set          put
//   get, wait    range; if missing, wait for the key on a watch of that key alone (opened at
//                the key's first wait and kept, with a background thread, for the next ones:
//                no gap, no polling, and no new connection per wait, since the rendezvous waits
//                in short slices; a key the watch knows to be missing is not read again). Up to kMaxKeyWatches are kept; the least recently used one
//                nobody waits on makes room. Not one watch over the prefix: every agent's store
//                would then get every put of the run (N join keys, N assignments a round: N^2
//                events a round over the job's agents).
//   add          read, then a txn "mod_revision unchanged (or key missing) -> put", retried
//                (etcd::call_counts() counts "failed compare-and-swap txns")
//   compare_set  the same txn pattern, with c10d's semantics (store.h)
//   check        one txn of count-only ranges
//   num_keys     a count-only range over the prefix (this store's keys, not all of etcd's)
//   multi_set    one txn of puts
//
// Blocking and timeouts: get()/wait() block up to timeout() (TimeoutError); every other call
// is one or a few round trips bounded by the client's request timeout. Thread-safe.
// Errors: as etcd_client.h (ConnectionError, TimeoutError, ProtocolError, GatewayStatusError),
// and StateError when add() finds a value that is not a decimal counter.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/store/store.h"

namespace dlaunch {

class EtcdStore final : public Store {
 public:
  // `prefix` is prepended to every key as is (give it a trailing '/').
  EtcdStore(std::shared_ptr<etcd::Client> client, std::string prefix);
  ~EtcdStore() override;  // stops the key watches' threads

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  // Ends a get/wait parked on a key watch (StoreInterruptedError); a call inside one HTTP
  // round trip finishes that trip (bounded by the client's request timeout) first.
  void interrupt() override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  // One transaction of ranges for the keys already there (one round trip for a rendezvous
  // reading every node's descriptor); blocks like get() only for missing ones.
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;

  // etcd-only: a put bound to a lease, so the key vanishes when the lease expires (liveness).
  void set_with_lease(const std::string& key, const Bytes& value, int64_t lease);

  const std::string& prefix() const { return prefix_; }
  etcd::Client& client() { return *client_; }

 private:
  std::string full(const std::string& key) const { return prefix_ + key; }
  // Blocks until `key` exists or `deadline` passes (TimeoutError naming `waited_for`).
  std::string wait_one(const std::string& key, TimePoint deadline, Duration waited_for);

  // Key watches kept at once (each is a connection and a thread): the event record of the
  // current round, a failure's verdict, and a few more while rounds change.
  static constexpr size_t kMaxKeyWatches = 4;
  class KeyWatch;
  // The running watch of `full_key` (a prefixed key), started (or restarted after a failure)
  // on demand.
  std::shared_ptr<KeyWatch> key_watch(const std::string& full_key);

  std::shared_ptr<etcd::Client> client_;
  std::string prefix_;
  struct Watched {
    std::shared_ptr<KeyWatch> watch;
    uint64_t last_use = 0;
  };
  std::mutex watch_mutex_;
  std::map<std::string, Watched> watches_;  // guarded by watch_mutex_
  uint64_t uses_ = 0;                       // guarded by watch_mutex_
};

}  // namespace dlaunch
