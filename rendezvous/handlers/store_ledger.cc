#include "rendezvous/handlers/store_ledger.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "rendezvous/handlers/forming_round_slice.h"

namespace dlaunch {

StoreRoundLedger::StoreRoundLedger(std::shared_ptr<Store> store, std::string prefix,
                                   Duration keep_alive_interval, const Clock& clock)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      keep_alive_interval_(keep_alive_interval),
      clock_(clock) {
  DL_CHECK(store_ != nullptr);
}

int64_t StoreRoundLedger::join(int64_t round, const NodeDescriptor& me) {
  int64_t index = store_->add(key(round, "arrivals"), 1);
  store_->set(key(round, fmt::format("node/{}", index)), me.encode());
  std::lock_guard<std::mutex> lock(mutex_);
  round_ = round;
  index_ = count_ = index;
  changed_at_ = clock_.now();
  set_keys_.clear();
  return index;
}

RoundLedger::Count StoreRoundLedger::arrivals(int64_t round, TimePoint now) {
  return note_count(round, store_->add(key(round, "arrivals"), 0), now);
}

RoundLedger::Count StoreRoundLedger::note_count(int64_t round, int64_t count, TimePoint now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (round != round_) return {count, now};
  if (count != count_) {
    count_ = count;
    changed_at_ = now;
  }
  return {count_, changed_at_};
}

RoundLedger::Described StoreRoundLedger::described(int64_t round, int64_t n,
                                                   TimePoint wait_until) {
  Described d;
  if (n <= 0) return d;
  std::vector<std::string> keys;
  for (int64_t i = 1; i <= n; ++i) keys.push_back(key(round, fmt::format("node/{}", i)));
  // An arrival counted but not yet described (its agent just added itself) is a moment away;
  // one that died between the two steps is not: wait until `wait_until`, then go on without it.
  bool all = true;
  try {
    store_->wait(keys, std::max<Duration>(wait_until - clock_.now(), std::chrono::milliseconds(1)));
  } catch (const TimeoutError&) {
    all = false;
  }
  std::vector<std::string> present;
  for (int64_t i = 1; i <= n; ++i) {
    // One request per arrival, only when some never described itself (rare).
    if (all || store_->check({keys[i - 1]})) {
      present.push_back(keys[i - 1]);
      d.indexes.push_back(i);
    }
  }
  if (present.empty()) return d;
  for (const auto& v : store_->multi_get(present)) d.nodes.push_back(NodeDescriptor::decode(v));
  return d;
}

Duration StoreRoundLedger::wait_slice(int64_t round, const DynamicLimits* limits,
                                      TimePoint until) {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool mine = round == round_;
  return forming_round_slice(limits, mine && index_ == 1, mine ? count_ : 0, changed_at_,
                             keep_alive_interval_, clock_.now(), until);
}

void StoreRoundLedger::saw_set(int64_t round, const std::string& wake_key) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (round == round_) set_keys_.insert(wake_key);
}

void StoreRoundLedger::wait(int64_t round, const std::string& wake_key,
                            const DynamicLimits* limits, TimePoint until) {
  Duration sleep = wait_slice(round, limits, until);
  if (sleep <= Duration::zero()) return;
  try {
    store_->wait({wake_key}, sleep);
  } catch (const TimeoutError&) {
    return;
  }
  saw_set(round, wake_key);
}

std::optional<RoundLedger::Fetched> StoreRoundLedger::wait_fetching(
    int64_t round, const std::vector<std::string>& keys, const DynamicLimits* limits,
    TimePoint until) {
  Duration sleep = wait_slice(round, limits, until);
  if (sleep <= Duration::zero()) return std::nullopt;
  std::vector<std::string> with_count = keys;
  with_count.push_back(key(round, "arrivals"));
  Fetched f;
  f.got = store_->wait_get(with_count, sleep);
  const auto& last = f.got.values.back();
  const std::string count = last ? to_string(*last) : "0";  // no arrival yet: no counter
  f.got.values.pop_back();
  try {
    f.arrivals = note_count(round, std::stoll(count), clock_.now());
  } catch (const std::logic_error&) {
    throw ProtocolError(
        fmt::format("round {}'s arrival counter holds '{}', not a count", round, count));
  }
  if (f.got.ready) saw_set(round, keys.at(0));
  return f;
}

Bytes StoreRoundLedger::wait_key(int64_t round, const std::string& key, TimePoint deadline) {
  bool known_set;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    known_set = round == round_ && set_keys_.count(key) != 0;
  }
  // A WAIT that times out is cancelled on the wire and keeps the connection (a get that timed
  // out would drop it: N reconnects at once). A key known to be set is read at once.
  if (!known_set) {
    auto left = std::max<Duration>(deadline - clock_.now(), std::chrono::milliseconds(1));
    store_->wait({key}, left);
  }
  return store_->get(key);
}

std::vector<std::optional<Bytes>> StoreRoundLedger::wait_key_fetching(
    int64_t round, const std::vector<std::string>& keys, TimePoint deadline) {
  // One WAIT_GET, answered at once when the key is set, else by the server at the deadline
  // (the connection is kept, as with a cancelled WAIT).
  auto left = std::max<Duration>(deadline - clock_.now(), std::chrono::milliseconds(1));
  auto got = store_->wait_get(keys, left);
  if (!got.ready) {
    throw TimeoutError(fmt::format("'{}' was not set within {:g} s", keys.at(0), to_seconds(left)));
  }
  saw_set(round, keys[0]);
  return std::move(got.values);
}

}  // namespace dlaunch
