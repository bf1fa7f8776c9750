#include "launcher/hang/hang_exchange.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/log.h"
#include "rendezvous/store/store.h"

namespace dlaunch {

namespace {

// Often enough that the wait ends moments after the stuck node's verdict lands; rare enough
// that a few nodes polling a store for a second cost it nothing.
constexpr Duration kPollEvery = std::chrono::milliseconds(50);

}  // namespace

NodeHangVerdict node_hang_verdict(const HangVerdict& v, int64_t node_rank, const std::string& host,
                                  int64_t global_rank, int pid, const std::string& stacks_dir) {
  const HangFinding& f = v.root_finding;
  NodeHangVerdict out;
  out.node_rank = node_rank;
  out.host = host;
  out.stuck_here = f.stopped || (!f.in_collective && (f.have_python || f.have_native));
  out.rank = global_rank;
  out.local_rank = v.root;
  out.pid = pid;
  out.where = f.where;
  out.python_stack = f.python_stack;
  out.stacks_dir = stacks_dir;
  return out;
}

std::string encode_hang_verdict(const NodeHangVerdict& v) {
  return nlohmann::json{{"node_rank", v.node_rank},       {"host", v.host},
                        {"stuck_here", v.stuck_here},     {"rank", v.rank},
                        {"local_rank", v.local_rank},     {"pid", v.pid},
                        {"where", v.where},               {"python_stack", v.python_stack},
                        {"stacks_dir", v.stacks_dir},     {"replaceable", v.replaceable}}
      .dump();
}

std::optional<NodeHangVerdict> decode_hang_verdict(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  try {
    NodeHangVerdict v;
    v.node_rank = j.at("node_rank").get<int64_t>();
    v.host = j.value("host", "");
    v.stuck_here = j.at("stuck_here").get<bool>();
    v.rank = j.value("rank", int64_t{-1});
    v.local_rank = j.value("local_rank", int64_t{-1});
    v.pid = j.value("pid", 0);
    v.where = j.value("where", "");
    v.python_stack = j.value("python_stack", "");
    v.stacks_dir = j.value("stacks_dir", "");
    v.replaceable = j.value("replaceable", false);
    return v;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::optional<NodeHangVerdict> pick_remote_hang_root(const NodeHangVerdict& mine,
                                                     const std::vector<NodeHangVerdict>& others) {
  if (mine.stuck_here) return std::nullopt;
  const NodeHangVerdict* best = nullptr;
  for (const auto& o : others) {
    if (o.node_rank == mine.node_rank || !o.stuck_here) continue;
    if (!best || o.node_rank < best->node_rank) best = &o;
  }
  if (!best) return std::nullopt;
  return *best;
}

std::string hang_verdict_key(int64_t round, int64_t node_rank) {
  return fmt::format("hang/{}/{}", round, node_rank);
}

std::optional<NodeHangVerdict> exchange_hang_verdicts(Store& job_store,
                                                      const HangExchangeRequest& request) {
  const NodeHangVerdict& mine = request.mine;
  job_store.set(hang_verdict_key(request.round, mine.node_rank),
                to_bytes(encode_hang_verdict(mine)));
  if (mine.stuck_here || request.nodes <= 1) return std::nullopt;
  const TimePoint deadline = steady_clock().now() + request.wait;
  std::set<int64_t> unheard;
  for (int64_t n = 0; n < request.nodes; ++n) {
    if (n != mine.node_rank) unheard.insert(n);
  }
  std::vector<NodeHangVerdict> heard;
  for (;;) {
    for (auto it = unheard.begin(); it != unheard.end();) {
      const std::string key = hang_verdict_key(request.round, *it);
      if (!job_store.check({key})) {
        ++it;
        continue;
      }
      if (auto v = decode_hang_verdict(to_string(job_store.get(key)))) heard.push_back(*v);
      it = unheard.erase(it);
    }
    if (auto root = pick_remote_hang_root(mine, heard)) return root;
    if (unheard.empty() || steady_clock().now() + kPollEvery > deadline) return std::nullopt;
    std::this_thread::sleep_for(kPollEvery);
  }
}

void start_hang_exchange(std::shared_ptr<Store> job_store, HangExchangeRequest request,
                         std::function<void(std::function<void()>)> post,
                         std::function<void(std::optional<NodeHangVerdict>)> done) {
  if (!job_store || request.nodes <= 1) {
    post([done = std::move(done)]() { done(std::nullopt); });
    return;
  }
  std::thread([job_store = std::move(job_store), request = std::move(request),
               post = std::move(post), done = std::move(done)]() {
    std::optional<NodeHangVerdict> root;
    try {
      root = exchange_hang_verdicts(*job_store, request);
    } catch (const std::exception& e) {
      log_warning("could not compare the hang with the other nodes' through the job's store "
                  "({}); naming the rank judged here",
                  e.what());
    }
    post([done, root]() { done(root); });
  }).detach();
}

std::string describe_remote_hang_root(const NodeHangVerdict& root) {
  std::string out = fmt::format("rank {} on node {} ({}, local rank {}, pid {})", root.rank,
                                root.node_rank, root.host, root.local_rank, root.pid);
  if (!root.where.empty()) out += ", stuck in " + root.where;
  return out;
}

}  // namespace dlaunch
