// etcd's RoundLedger (dynamic_rendezvous_ledger.h): arrivals without contention, waiting
// without a watch event per arrival.
//
//   join       one transaction: "if joins/<r>/<node> is missing: put it (the node's
//              descriptor) and count the keys under joins/<r>/". The count is the arrival
//              index: etcd serialises transactions, so indices are dense and in join order,
//              and no node ever retries (the store counter's read-then-compare-and-swap made
//              64 nodes joining at once retry about 17 times each). The join keys carry no
//              lease: an arrival index never changes, as with the store counter; a dead node
//              is handled by the keep-alive leases as before.
//   order      arrival i is the i-th join key by create_revision: participants(r, n) is one
//              range sorted by create_revision, limit n.
//   waiting    after joining, one watch on the round's control keys from "done" to
//              "workers_store" (the keys a waiting node waits for; the span also holds "event",
//              "superseded", "takeover" and "verdict"), each set once a round, so a waiting
//              node gets O(1) events however many join. Not the whole "round/<r>/" prefix: the
//              counters "acks" and "closer" sort before the span, and every node of the round
//              may add to them (each add a put: at 2,048 simulated agents, 9 to 40 racing
//              closers were as many events for every waiting node). The join keys live outside
//              (under "joins/<r>/") because they are N puts: with them inside, every arrival was
//              an event for every waiting node, N^2/2 events a round (36.5 per agent at 64
//              agents, 258.5 at 512). The arrival count is
//              read, not watched: the first arrival re-reads it every last_call_timeout / 5 to
//              measure the last call, the others once per keep-alive interval, at most once a
//              second (forming_round_slice.h, the rule the store ledger follows).
//   arrivals() one count-only range (fresh, as the contract asks).
//
// Blocking and errors: join/arrivals/participants are one or two etcd round trips (the
// client's request timeout); wait/wait_key block until their deadline. A broken watch is
// reopened from the last revision seen (re-read when etcd compacted it). etcd errors
// propagate (etcd_client.h); a join key in the round's control prefix, where builds before
// this layout put them, throws StateError: nodes of one job must run the same build.
// Thread-safety: arrivals() and participants() from any thread; join/wait/wait_key from the
// rendezvous thread only (they own the watch).
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
  // `keep_alive_interval` bounds the sleep of a node that does not measure the last call.
  // `clock` must be steady_clock() or advance with it (it times the watch's waits).
  EtcdRoundLedger(std::shared_ptr<EtcdStore> store, std::string prefix,
                  Duration keep_alive_interval, const Clock& clock);
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
  // Outside round/<r>/, which the waiting nodes watch (see the header comment).
  std::string join_prefix(int64_t round) const {
    return prefix_ + "/joins/" + std::to_string(round) + "/";
  }
  std::string full(const std::string& key) const { return store_->prefix() + key; }
  // Mirrors `round`, in which this node is arrival `index` (0: not joined) of `count`.
  // `controls`: the round's control keys as of `revision`. Call with mutex_ held.
  void mirror(int64_t round, int64_t index, int64_t revision, int64_t count,
              const etcd::RangeResponse& controls);
  // Mirrors `round`'s control keys and count from a fresh read (a round this node did not
  // join, or a lost watch).
  void resync(int64_t round);
  // Applies the watch's next message, waiting at most until `until`. Reopens a lost watch.
  void pump(int64_t round, TimePoint until);
  // The keys of `round` this ledger mirrors and watches (see the header comment), as a range.
  static constexpr const char* kFirstWatched = "done";
  static constexpr const char* kLastWatched = "workers_store";
  etcd::Op watched_keys(int64_t round) const;
  // A join key where builds before the joins/ prefix put it (`value`: its descriptor).
  [[noreturn]] void throw_old_layout_join(int64_t round, const std::string& value) const;

  std::shared_ptr<EtcdStore> store_;
  std::string prefix_;
  Duration keep_alive_interval_;
  const Clock& clock_;
  std::unique_ptr<etcd::Watch> watch_;  // rendezvous thread only

  std::mutex mutex_;  // guards the mirror below
  int64_t round_ = -1;
  int64_t index_ = 0;     // this node's arrival index in round_ (0: it did not join round_)
  int64_t revision_ = 0;  // the watch has delivered round_'s control keys up to this revision
  int64_t count_ = 0;     // the latest arrival count read for round_
  int64_t count_revision_ = 0;  // the etcd revision of that read
  TimePoint changed_at_{};
  std::unordered_map<std::string, std::string> keys_;  // control keys of round_ -> value
};

}  // namespace dlaunch
