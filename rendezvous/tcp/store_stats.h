// Counters a TCP store server keeps about itself, for the agent's /status and /metrics
// (launcher/status/status_server.h): requests served, how long handling one took, keys held, and the
// requests by op and by who asked (agents, or the workers PyTorch connects), which is what tells
// a job's store traffic apart from the rendezvous's (docs/store_protocol.md).
//
// Latency is the server's service time: from a decoded request to its reply queued (or the
// request parked, for a GET on a missing key: the wait for the key is the client's, not the
// server's). It is kept in a histogram of power-of-two microsecond buckets, so p50/p99 are
// bucket upper bounds (within a factor of two), at the price of one atomic add per request.
//
// Threading: record() is called from the server thread; snapshot() from any thread. Lock-free
// but for the short mutex snapshot() holds to compute the request rate.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "rendezvous/tcp/store_codec.h"

namespace dlaunch {

struct StoreStatsSnapshot {
  int64_t requests = 0;       // served since start
  int64_t keys = 0;           // in the table after the latest request
  int64_t connections = 0;    // open now (filled by the server, as the three below)
  int64_t connections_peak = 0;      // the most open at once since start
  int64_t connections_accepted = 0;  // accepted since start
  // Clients' connections carried inside a node's store proxy's one connection (CHANNELS), opened
  // since start: how many workers reached the store through proxies, which `connections` no
  // longer shows.
  int64_t channels_opened = 0;
  double requests_per_s = 0;  // over the interval since the previous snapshot (>= 1 s)
  double p50_seconds = 0;     // 0 when no request was served
  double p99_seconds = 0;
  double latency_sum_seconds = 0;
  // Histogram for Prometheus: cumulative counts at each bucket's upper bound (seconds).
  static constexpr size_t kBuckets = 24;  // 1 us .. 2^23 us (~8 s), then +Inf
  std::array<int64_t, kBuckets + 1> cumulative{};
  // Requests by op name ("GET", "ADD"...), ops never asked left out; from sessions that declared
  // themselves an agent's, and from the others (workers).
  std::map<std::string, int64_t> agent_requests_by_op;
  std::map<std::string, int64_t> worker_requests_by_op;
  static double bucket_bound_seconds(size_t i) { return static_cast<double>(1ULL << i) * 1e-6; }
};

class StoreStats {
 public:
  void record(wire::Op op, bool from_agent, std::chrono::steady_clock::duration took,
              size_t keys_now);
  // The table changed without a request (the hosting process's own write).
  void note_keys(size_t keys_now) { keys_.store(static_cast<int64_t>(keys_now), std::memory_order_relaxed); }
  StoreStatsSnapshot snapshot() const;

 private:
  std::array<std::atomic<int64_t>, StoreStatsSnapshot::kBuckets + 1> buckets_{};
  std::array<std::atomic<int64_t>, wire::kOpCount> agent_ops_{};
  std::array<std::atomic<int64_t>, wire::kOpCount> worker_ops_{};
  std::atomic<int64_t> keys_{0};
  std::atomic<int64_t> latency_sum_ns_{0};
  mutable std::mutex rate_mutex_;
  mutable std::chrono::steady_clock::time_point rate_at_ = std::chrono::steady_clock::now();
  mutable int64_t rate_requests_ = 0;
  mutable double rate_ = 0;
};

}  // namespace dlaunch
