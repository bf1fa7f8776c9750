#include "launcher/agent/rank_replacement.h"

#include <fmt/format.h>

#include "launcher/hang/heartbeat_file.h"
#include "rendezvous/store/store.h"
#include "rendezvous/tcp/tcp_store_client.h"

namespace dlaunch {

std::string recovery_key(const std::string& run_id, int64_t restart_count) {
  return fmt::format("dlaunch/recovery/{}/attempt_{}", run_id, restart_count);
}

bool replacement_in_flight(
    const WorkerGroup& group,
    const std::function<std::optional<TimePoint>(const std::string&)>& last_beat) {
  for (const WorkerRecord& w : group.workers()) {
    if (w.replacing) return true;
    if (w.replacement && w.running() && !last_beat(w.heartbeat_file)) return true;
  }
  return false;
}

bool any_announced(const WorkerGroup& group) {
  for (const WorkerRecord& w : group.workers()) {
    if (!w.heartbeat_file.empty() && announced_rank_recovery(w.heartbeat_file)) return true;
  }
  return false;
}

bool all_announced(const WorkerGroup& group) {
  for (const WorkerRecord& w : group.workers()) {
    if (!w.running() || w.heartbeat_file.empty() || !announced_rank_recovery(w.heartbeat_file)) {
      return false;
    }
  }
  return !group.workers().empty();
}

RankRecovery::~RankRecovery() = default;

void RankRecovery::begin(std::string key, std::string host, int64_t port,
                         std::optional<std::string> token) {
  key_ = std::move(key);
  host_ = std::move(host);
  port_ = port;
  token_ = std::move(token);
  restart_announced_ = false;
  // A new connection per group: the store gives a worker's connection the namespace current at
  // its first key operation, and a new round has a new one.
  store_.reset();
}

void RankRecovery::off() {
  key_.clear();
  store_.reset();
  restart_announced_ = false;
}

Store& RankRecovery::store() {
  if (!store_) {
    TcpStoreClientOptions o;
    o.host = host_;
    o.port = static_cast<uint16_t>(port_);
    o.token = token_;
    o.lazy_connect = true;
    o.connect_timeout = kRecoveryStoreTimeout;
    o.reconnect_timeout = kRecoveryStoreTimeout;
    o.timeout = kRecoveryStoreTimeout;
    o.agent = false;  // the workers' namespace (see the header)
    store_ = std::make_shared<TcpStoreClient>(o);
  }
  return *store_;
}

int64_t RankRecovery::announce(const std::string& verdict) {
  const int64_t generation = store().add(key_, 1);
  store_->set(key_ + "/" + std::to_string(generation), to_bytes(verdict));
  if (verdict == kRestartVerdict) restart_announced_ = true;
  return generation;
}

int64_t RankRecovery::current_generation() { return store().add(key_, 0); }

int64_t RankRecovery::announce_shrink(int64_t before, int64_t world, int64_t round) {
  int64_t generation = store().add(key_, 1);
  if (generation <= before) generation = store_->add(key_, before + 1 - generation);
  store_->set(key_ + "/" + std::to_string(generation),
              to_bytes(fmt::format("{} {} {}", kShrinkVerdict, world, round)));
  return generation;
}

void RankRecovery::tell_new_ranks(int64_t round,
                                  const std::vector<std::pair<int64_t, int64_t>>& ranks) {
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (const auto& [old_rank, new_rank] : ranks) {
    keys.push_back(fmt::format("{}/shrink_{}/rank_{}", key_, round, old_rank));
    values.push_back(to_bytes(std::to_string(new_rank)));
  }
  store().multi_set(keys, values);
}

}  // namespace dlaunch
