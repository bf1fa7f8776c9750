#include "rendezvous/etcd/etcd_ledger.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/handlers/forming_round_slice.h"
#include "rendezvous/handlers/rendezvous_handler.h"

namespace dlaunch {
namespace {

std::string as_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

// The count-only range of every key under `prefix`.
etcd::Op count_prefix(const std::string& prefix) {
  auto op = etcd::Op::get_prefix(prefix);
  op.count_only = true;
  return op;
}

}  // namespace

EtcdRoundLedger::EtcdRoundLedger(std::shared_ptr<EtcdStore> store, std::string prefix,
                                 Duration keep_alive_interval, const Clock& clock)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      keep_alive_interval_(keep_alive_interval),
      clock_(clock) {
  DL_CHECK(store_ != nullptr);
}

EtcdRoundLedger::~EtcdRoundLedger() = default;

int64_t EtcdRoundLedger::join(int64_t round, const NodeDescriptor& me) {
  auto& client = store_->client();
  const std::string key = full(join_prefix(round) + me.id);
  const std::string joins = full(join_prefix(round));
  const etcd::Op control = watched_keys(round);
  // The round's control keys come back with the join, as of its revision: a "done" set just
  // before this node joined is in the mirror, and the watch takes over from there.
  auto t = client.txn({etcd::Compare::missing(key)},
                      {etcd::Op::put(key, as_string(me.encode())), count_prefix(joins),
                       control},
                      {etcd::Op::get(key)});
  int64_t index = 0, count = 0, revision = t.revision;
  const etcd::RangeResponse* controls = nullptr;
  if (t.succeeded) {
    DL_CHECK(t.responses.size() == 3) << "etcd answered " << t.responses.size() << " of 3 ops";
    index = count = t.responses[1].range.count;
    controls = &t.responses[2].range;
  } else {
    // Our key is there already: an earlier attempt of this very join went through although
    // its answer was lost. The index is the number of joins up to ours.
    DL_CHECK(t.responses.size() == 1 && !t.responses[0].range.kvs.empty())
        << "etcd's failed join transaction did not return the join key " << key;
    // (etcd's "count" ignores max_create_revision, which filters only the keys returned.)
    auto upto = etcd::Op::get_prefix(joins);
    upto.max_create_revision = t.responses[0].range.kvs.front().create_revision;
    t = client.txn({}, {upto, count_prefix(joins), control}, {});
    DL_CHECK(t.responses.size() == 3) << "etcd answered " << t.responses.size() << " of 3 ops";
    index = static_cast<int64_t>(t.responses[0].range.kvs.size());
    count = t.responses[1].range.count;
    revision = t.revision;
    controls = &t.responses[2].range;
  }
  DL_CHECK(index >= 1 && index <= count) << "arrival index " << index << " of " << count;
  watch_.reset();  // the previous round's; the next wait opens one for this round
  std::lock_guard<std::mutex> lock(mutex_);
  mirror(round, index, revision, count, *controls);
  return index;
}

void EtcdRoundLedger::mirror(int64_t round, int64_t index, int64_t revision, int64_t count,
                             const etcd::RangeResponse& controls) {
  if (round_ != round || count != count_) changed_at_ = clock_.now();
  round_ = round;
  index_ = index;
  revision_ = count_revision_ = revision;
  count_ = count;
  keys_.clear();
  for (const auto& kv : controls.kvs) keys_[kv.key] = kv.value;
}

etcd::Op EtcdRoundLedger::watched_keys(int64_t round) const {
  auto op = etcd::Op::get(full(round_key(round, kFirstWatched)));
  op.range_end = full(round_key(round, kLastWatched)) + std::string(1, '\0');
  return op;
}

void EtcdRoundLedger::resync(int64_t round) {
  watch_.reset();
  auto t = store_->client().txn({}, {watched_keys(round), count_prefix(full(join_prefix(round)))},
                                {});
  DL_CHECK(t.responses.size() == 2) << "etcd answered " << t.responses.size() << " of 2 ops";
  std::lock_guard<std::mutex> lock(mutex_);
  mirror(round, round_ == round ? index_ : 0, t.revision, t.responses[1].range.count,
         t.responses[0].range);
}

EtcdRoundLedger::Count EtcdRoundLedger::arrivals(int64_t round, TimePoint now) {
  auto r = store_->client().range(full(join_prefix(round)),
                                  etcd::prefix_end(full(join_prefix(round))), true);
  std::lock_guard<std::mutex> lock(mutex_);
  if (round != round_) return {r.count, now};
  if (r.revision > count_revision_) {
    if (r.count != count_) changed_at_ = now;
    count_ = r.count;
    count_revision_ = r.revision;
  }
  return {count_, changed_at_};
}

std::vector<NodeDescriptor> EtcdRoundLedger::participants(int64_t round, int64_t n) {
  if (n <= 0) return {};
  auto op = etcd::Op::get_prefix(full(join_prefix(round)));
  op.sort_by_create = true;
  op.limit = n;
  auto t = store_->client().txn({}, {op}, {});
  DL_CHECK(t.responses.size() == 1) << "etcd answered " << t.responses.size() << " of 1 op";
  const auto& kvs = t.responses[0].range.kvs;
  if (static_cast<int64_t>(kvs.size()) < n) {
    throw StateError(fmt::format(
        "etcd rendezvous round {}: expected {} join keys under '{}', found {}; were the run's "
        "keys deleted while it ran (etcdctl del --prefix)?",
        round, n, full(join_prefix(round)), kvs.size()));
  }
  std::vector<NodeDescriptor> out;
  for (const auto& kv : kvs) out.push_back(NodeDescriptor::decode(to_bytes(kv.value)));
  return out;
}

RoundLedger::Described EtcdRoundLedger::described(int64_t round, int64_t n, TimePoint) {
  Described d;
  d.nodes = participants(round, n);
  for (int64_t i = 1; i <= n; ++i) d.indexes.push_back(i);
  return d;
}

void EtcdRoundLedger::pump(int64_t round, TimePoint until) {
  int64_t followed, from;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    followed = round_;
    from = revision_;
  }
  if (followed != round) {
    // Not a round this node mirrors yet (wait_key on another round): read it afresh.
    resync(round);
    return;
  }
  const etcd::Op span = watched_keys(round);
  try {
    if (!watch_) watch_ = store_->client().watch(span.key, span.range_end, from + 1);
    auto left = std::max<Duration>(until - clock_.now(), Duration::zero());
    auto message = watch_->next(std::chrono::steady_clock::now() + left);
    if (!message) return;
    const std::string old_joins = full(round_key(round, "join/"));
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& event : message->events) {
      auto& kv = event.kv;
      if (kv.key.rfind(old_joins, 0) == 0) throw_old_layout_join(round, kv.value);
      if (event.type == etcd::Event::Type::kPut) {
        keys_[kv.key] = std::move(kv.value);
      } else {
        keys_.erase(kv.key);
      }
      revision_ = std::max(revision_, kv.mod_revision);
    }
  } catch (const ProtocolError& e) {
    // etcd cancelled the watch (e.g. our start revision was compacted): read the round again.
    log_debug("etcd rendezvous: watch from {} cancelled ({}); re-reading the round", span.key,
              e.what());
    resync(round);
  } catch (const ClosedError& e) {
    // The stream ended (etcd restarted, a proxy closed it): the next pump reopens it from the
    // last revision seen, so nothing is missed.
    log_debug("etcd rendezvous: watch from {} closed ({}); reopening", span.key, e.what());
    watch_.reset();
  }
}

void EtcdRoundLedger::throw_old_layout_join(int64_t round, const std::string& value) const {
  std::string who = "a node";
  try {
    NodeDescriptor d = NodeDescriptor::decode(to_bytes(value));
    who = fmt::format("node '{}' on {}", d.id, d.host);
  } catch (const Error&) {
    // Not even a descriptor: name the key's place only.
  }
  throw NodeMismatchError(fmt::format(
      "etcd rendezvous round {}: {} joined under '{}', where dlaunch builds older than this one "
      "put their join keys (this build puts them under '{}'); every node of a job must run the "
      "same dlaunch build: install this one on every node and start the job again",
      round, who, full(round_key(round, "join/")), full(join_prefix(round))));
}

void EtcdRoundLedger::wait(int64_t round, const std::string& wake_key,
                           const DynamicLimits* limits, TimePoint until) {
  const std::string wake = full(wake_key);
  bool planned = false;  // look_at is set (a node waiting in its round)
  TimePoint look_at{};   // when to read the count next
  std::optional<TimePoint> full_since;  // when this node saw the round full
  while (true) {
    const TimePoint now = clock_.now();
    bool mine;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      mine = round_ == round;
      if (mine) {
        if (keys_.count(wake) != 0) return;
        if (limits && count_ >= limits->max_nodes) {
          // The MAX-th arrival closes the round right after its join, and the first arrival
          // backs it up. Any other node that saw the round full gives them a slice first:
          // when every node that read the count at MAX tried to close it (compare-and-swap
          // of the state, then an add to pick the closer, both retried under contention on
          // etcd), 2,048 simulated agents once made 13,000 failed transactions and took 24 s.
          // A MAX-th arrival that died costs the others that slice.
          if (index_ == 1) return;
          if (!full_since) full_since = now;
          const TimePoint give_up = *full_since + std::min<Duration>(keep_alive_interval_,
                                                                    std::chrono::seconds(1));
          if (now >= give_up) return;
          look_at = std::min(until, give_up);
          planned = true;
        }
        if (limits && count_ < limits->max_nodes && count_ >= limits->min_nodes &&
            now >= changed_at_ + limits->last_call_timeout) {
          return;
        }
        if (limits && !planned) {
          planned = true;
          look_at = now + forming_round_slice(limits, index_ == 1, count_, changed_at_,
                                              keep_alive_interval_, now, until);
        }
      }
    }
    if (now >= until) return;
    if (!limits || !mine) {
      pump(round, until);
    } else if (full_since) {
      pump(round, look_at);  // for "done", until the slice given to the closers ends
    } else if (now >= look_at) {
      arrivals(round, now);
      planned = false;
    } else {
      pump(round, look_at);
    }
  }
}

Bytes EtcdRoundLedger::wait_key(int64_t round, const std::string& key, TimePoint deadline) {
  const std::string k = full(key);
  const etcd::Op span = watched_keys(round);
  DL_CHECK(k >= span.key && k < span.range_end)
      << "wait_key: " << key << " is not a key of round " << round << " this ledger watches";
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (round_ == round) {
        if (auto it = keys_.find(k); it != keys_.end()) return to_bytes(it->second);
      }
    }
    if (clock_.now() >= deadline) {
      throw TimeoutError(fmt::format(
          "etcd rendezvous: key '{}' did not appear in time; the node that should set it may "
          "have died",
          k));
    }
    pump(round, deadline);
  }
}

}  // namespace dlaunch
