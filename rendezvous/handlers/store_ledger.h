// The RoundLedger (dynamic_rendezvous_ledger.h) over any Store: the c10d backend's.
//
//   join       an atomic add on "round/<r>/arrivals" gives the arrival index, then the node's
//              descriptor goes under "round/<r>/node/<index>": two requests, cheap on the TCP
//              store, whose add is one request.
//   arrivals() add(0) on the counter.
//   described  the descriptors under node/1..n; an arrival counted but not described yet (its
//              agent is between its two requests, or died there) is waited for, then left out.
//   waiting    no watch: the waiting node sleeps on the round's wake-up key ("done" when the
//              round completes, "superseded" when the next one opens), which the store sets
//              for every node at once, and re-reads the count when the slice ends
//              (forming_round_slice.h). Only the first arrival polls (every
//              last_call_timeout / 5, 10-250 ms) to measure the last call; the others would be
//              N pollers (16,384 x 5 reads/s), so they look once
//              per keep-alive interval, at most once a second: a first arrival that died costs
//              at most that. (Longer slices, 5 s, made 512 real agents on one host come up
//              1.4 s later in agents_bench: the waiting call holds its connection for the whole
//              slice; not yet understood.) A node waiting in its own round reads, with the
//              wait, what it decides by (wait_fetching: one WAIT_GET, answered by the server
//              when the slice ends, with the state and the count, or with its place in the
//              round once it is released).
//
// Blocking and errors: every call is one or a few store round trips; wait/wait_key block for
// one slice / until their deadline. The store's errors propagate. Thread-safety: arrivals()
// from any thread (num_nodes_waiting), the rest from the rendezvous thread.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "rendezvous/handlers/dynamic_rendezvous_ledger.h"

namespace dlaunch {

class StoreRoundLedger final : public RoundLedger {
 public:
  // `prefix`: the rendezvous' key prefix (DynamicRendezvous::key_prefix). `keep_alive_interval`
  // bounds the sleep of a node that does not measure the last call.
  StoreRoundLedger(std::shared_ptr<Store> store, std::string prefix, Duration keep_alive_interval,
                   const Clock& clock);

  int64_t join(int64_t round, const NodeDescriptor& me) override;
  Count arrivals(int64_t round, TimePoint now) override;
  Described described(int64_t round, int64_t n, TimePoint wait_until) override;
  void wait(int64_t round, const std::string& wake_key, const DynamicLimits* limits,
            TimePoint until) override;
  std::optional<Fetched> wait_fetching(int64_t round, const std::vector<std::string>& keys,
                                       const DynamicLimits* limits, TimePoint until) override;
  Bytes wait_key(int64_t round, const std::string& key, TimePoint deadline) override;
  std::vector<std::optional<Bytes>> wait_key_fetching(int64_t round,
                                                      const std::vector<std::string>& keys,
                                                      TimePoint deadline) override;

 private:
  std::string key(int64_t round, const std::string& suffix) const {
    return ledger_round_key(prefix_, round, suffix);
  }
  // How long one wait() may sleep on its wake key (see the header comment); <= 0: not at all.
  Duration wait_slice(int64_t round, const DynamicLimits* limits, TimePoint until);
  void saw_set(int64_t round, const std::string& wake_key);
  // The mirror of the joined round's count, given a count read at `now`.
  Count note_count(int64_t round, int64_t count, TimePoint now);

  std::shared_ptr<Store> store_;
  std::string prefix_;
  Duration keep_alive_interval_;
  const Clock& clock_;

  std::mutex mutex_;  // guards the mirror of the joined round below
  int64_t round_ = -1;
  int64_t index_ = 0;  // this node's arrival index in round_
  int64_t count_ = 0;  // the latest arrival count seen for round_
  TimePoint changed_at_{};
  std::set<std::string> set_keys_;  // wake-up keys of round_ seen set (no need to wait again)
};

}  // namespace dlaunch
