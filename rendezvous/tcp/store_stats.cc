#include "rendezvous/tcp/store_stats.h"

#include <algorithm>

namespace dlaunch {

namespace {

std::map<std::string, int64_t> by_op_name(
    const std::array<std::atomic<int64_t>, wire::kOpCount>& counts) {
  std::map<std::string, int64_t> named;
  for (size_t i = 0; i < counts.size(); ++i) {
    const int64_t n = counts[i].load(std::memory_order_relaxed);
    if (n > 0) named[wire::op_name(static_cast<wire::Op>(i))] = n;
  }
  return named;
}

}  // namespace

void StoreStats::record(wire::Op op, bool from_agent, std::chrono::steady_clock::duration took,
                        size_t keys_now) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(took).count();
  if (ns < 0) ns = 0;
  auto us = static_cast<uint64_t>(ns / 1000);
  size_t bucket = 0;
  while (bucket < StoreStatsSnapshot::kBuckets && (1ULL << bucket) < us + 1) ++bucket;
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  latency_sum_ns_.fetch_add(ns, std::memory_order_relaxed);
  (from_agent ? agent_ops_ : worker_ops_)[static_cast<size_t>(op)].fetch_add(
      1, std::memory_order_relaxed);
  keys_.store(static_cast<int64_t>(keys_now), std::memory_order_relaxed);
}

StoreStatsSnapshot StoreStats::snapshot() const {
  StoreStatsSnapshot s;
  int64_t total = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.requests = total;
  s.keys = keys_.load(std::memory_order_relaxed);
  s.agent_requests_by_op = by_op_name(agent_ops_);
  s.worker_requests_by_op = by_op_name(worker_ops_);
  s.latency_sum_seconds =
      static_cast<double>(latency_sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  auto quantile = [&](double q) {
    if (total == 0) return 0.0;
    auto rank = static_cast<int64_t>(q * static_cast<double>(total - 1)) + 1;
    for (size_t i = 0; i < s.cumulative.size(); ++i) {
      if (s.cumulative[i] >= rank) {
        return StoreStatsSnapshot::bucket_bound_seconds(std::min(i, StoreStatsSnapshot::kBuckets));
      }
    }
    return StoreStatsSnapshot::bucket_bound_seconds(StoreStatsSnapshot::kBuckets);
  };
  s.p50_seconds = quantile(0.50);
  s.p99_seconds = quantile(0.99);
  // The rate moves only once a second has passed since the last one, so two scrapes in a row
  // do not divide by a few microseconds.
  std::lock_guard<std::mutex> lock(rate_mutex_);
  auto now = std::chrono::steady_clock::now();
  double dt = std::chrono::duration<double>(now - rate_at_).count();
  if (dt >= 1.0) {
    rate_ = static_cast<double>(total - rate_requests_) / dt;
    rate_at_ = now;
    rate_requests_ = total;
  }
  s.requests_per_s = rate_;
  return s;
}

}  // namespace dlaunch
