// etcd's RoundLedger (dynamic_rendezvous_ledger.h): arrivals without contention, waiting
// without polling.
//
//   join       one transaction: "if round/<r>/join/<node> is missing: put it (the node's
//              descriptor) and count the keys under round/<r>/join/". The count is the arrival
//              index: etcd serialises transactions, so indices are dense and in join order,
//              and no node ever retries (the store counter's read-then-compare-and-swap made
//              64 nodes joining at once retry about 17 times each). The join keys carry no
//              lease: an arrival index never changes, as with the store counter; a dead node
//              is handled by the keep-alive leases as before.
//   order      arrival i is the i-th join key by create_revision: participants(r, n) is one
//              range sorted by create_revision, limit n.
//   waiting    after joining, one watch on "round/<r>/" from the join's revision: new join
//              keys (arrival count, last call), "done", "superseded", the workers' store
//              address; the waiting node wakes only when the decision may change (MAX reached,
//              last call passed, a wake key set), instead of re-reading every poll interval.
//   arrivals() one count-only range (fresh, as the contract asks; callers loop rarely now).
//
// Blocking and errors: join/arrivals/participants are one or two etcd round trips (the
// client's request timeout); wait/wait_key block until their deadline. A broken watch is
// reopened from the last revision seen (re-read when etcd compacted it). etcd errors
// propagate (etcd_client.h). Thread-safety: arrivals() and participants() from any thread;
// join/wait/wait_key from the rendezvous thread only (they own the watch).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "rendezvous/handlers/dynamic_rendezvous_ledger.h"
#include "rendezvous/etcd/etcd_store.h"

namespace dlaunch {

class EtcdRoundLedger final : public RoundLedger {
 public:
  // `prefix`: the rendezvous' store-level key prefix (DynamicRendezvous::key_prefix).
  // `clock` must be steady_clock() or advance with it (it times the watch's waits).
  EtcdRoundLedger(std::shared_ptr<EtcdStore> store, std::string prefix, const Clock& clock);
  ~EtcdRoundLedger() override;

  int64_t join(int64_t round, const NodeDescriptor& me) override;
  Count arrivals(int64_t round, TimePoint now) override;
  // Every arrival is described (the join is atomic): `wait_until` does not matter.
  Described described(int64_t round, int64_t n, TimePoint wait_until) override;
  void wait(int64_t round, const std::string& wake_key, const DynamicLimits* limits,
            TimePoint until) override;
  Bytes wait_key(int64_t round, const std::string& key, TimePoint deadline) override;

  // The store key under round `round`'s prefix, e.g. round_key(3, "done").
  std::string round_key(int64_t round, const std::string& suffix) const {
    return ledger_round_key(prefix_, round, suffix);
  }
  // Descriptors of arrivals 1..n in index order. Throws StateError when fewer exist.
  std::vector<NodeDescriptor> participants(int64_t round, int64_t n);

 private:
  std::string join_prefix(int64_t round) const { return round_key(round, "join/"); }
  std::string full(const std::string& key) const { return store_->prefix() + key; }
  // Starts mirroring `round` as of `revision` with `count` arrivals (after a join).
  void follow(int64_t round, int64_t revision, int64_t count);
  // Mirrors `round` from a fresh read (a round this node did not join, or a lost watch).
  void resync(int64_t round);
  // Applies the watch's next message, waiting at most until `until`. Reopens a lost watch.
  void pump(int64_t round, TimePoint until);

  std::shared_ptr<EtcdStore> store_;
  std::string prefix_;
  const Clock& clock_;
  std::unique_ptr<etcd::Watch> watch_;  // rendezvous thread only

  std::mutex mutex_;  // guards the mirror below
  int64_t round_ = -1;
  int64_t revision_ = 0;  // the mirror reflects round_ up to this etcd revision
  int64_t count_ = 0;     // join keys of round_ created at or before revision_
  TimePoint changed_at_{};
  std::unordered_map<std::string, std::string> keys_;  // other keys of round_ -> value
};

}  // namespace dlaunch
