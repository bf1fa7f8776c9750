#include "worker/train/rank_recovery.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/env.h"
#include "common/error.h"
#include "common/heartbeat.h"
#include "common/log.h"

namespace dlaunch::train {

namespace {

using Clock = std::chrono::steady_clock;

// A survivor's wait for the agent's verdict is cut into slices, each followed by a heartbeat: a
// worker waiting for its peer's replacement is not hung (--hang_timeout). Short, so that the gap
// it shows stays near a step's: --hang_timeout auto learns the longest gap.
constexpr std::chrono::milliseconds kVerdictSlice{200};
// How often a join's watcher asks whether the next generation exists, and re-interrupts the
// join's store client once it does (an interrupt that came between two of its calls is lost).
constexpr std::chrono::milliseconds kWatchSlice{100};
constexpr std::chrono::milliseconds kInterruptRetry{10};

std::string what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

// The failure was a collective's timeout: the peer may be stuck rather than gone.
bool timed_out(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError&) {
    return true;
  } catch (...) {
    return false;
  }
}

double ms_since(Clock::time_point t) {
  return 1e3 * std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

std::string rank_recovery_off_reason(const TrainConfig& config, const WorkerEnv& env,
                                     const std::string& group_backend) {
  if (recovery_key_from_env().empty()) {
    return fmt::format("{} is not set (the agent restarts whole groups)", env_names::kRecoveryKey);
  }
  if (!config.rank_recovery) return "--rank_recovery off";
  if (env.world_size < 2) return "a world of one";
  if (group_backend == "nccl") {
    return "the group is NCCL, whose broken communicator dtrain cannot drop in process yet";
  }
  return "";
}

std::string recovery_key_from_env() { return get_env_or(env_names::kRecoveryKey, ""); }

int64_t current_generation(Store& store, const std::string& key) { return store.add(key, 0); }

bool is_peer_failure(const std::exception& e) {
  return dynamic_cast<const ConnectionError*>(&e) != nullptr ||
         dynamic_cast<const TimeoutError*>(&e) != nullptr;
}

std::unique_ptr<comm::ProcessGroup> join_generation(Store& counter, const std::string& key,
                                                    int64_t g, int rank, int world,
                                                    const ConnectStore& connect,
                                                    const JoinGroup& join) {
  const std::shared_ptr<Store> client = connect();
  const std::string next = fmt::format("{}/{}", key, g + 1);
  std::mutex mu;
  std::condition_variable cv;
  bool joined = false;
  bool watcher_done = false;
  std::atomic<bool> superseded{false};
  // The watcher asks in slices (an interrupt that comes between two of its calls is lost, and
  // the next slice ends it); once it saw the next generation it interrupts the join's client
  // until the join gave up.
  std::thread watcher([&] {
    bool seen = false;
    for (;;) {
      // Waiting for peers to join is not a hang (the join's own timeout bounds it): the agent's
      // hang check would otherwise take this worker (and a replacement that never beat yet) for
      // hung while a stuck peer keeps the join from completing, and the stuck peer could not be
      // replaced alone.
      heartbeat();
      {
        std::lock_guard<std::mutex> lock(mu);
        if (joined) break;
      }
      try {
        seen = counter.wait_get({next}, kWatchSlice).ready;
      } catch (const Error&) {
        // interrupted at the join's end, or the store is out of reach for a moment: the join's
        // own timeout still bounds it
        std::this_thread::sleep_for(kInterruptRetry);
      }
      if (seen) break;
    }
    std::unique_lock<std::mutex> lock(mu);
    if (seen) {
      superseded = true;
      while (!joined) {
        client->interrupt();
        cv.wait_for(lock, kInterruptRetry);
      }
    }
    watcher_done = true;
    cv.notify_all();
  });
  // The join is over: the watcher's wait is cut short rather than left to its slice.
  auto finish = [&] {
    std::unique_lock<std::mutex> lock(mu);
    joined = true;
    cv.notify_all();
    while (!watcher_done) {
      counter.interrupt();
      cv.wait_for(lock, kInterruptRetry);
    }
    lock.unlock();
    watcher.join();
  };
  std::unique_ptr<comm::ProcessGroup> group;
  try {
    group = join(g, rank, world, client);
  } catch (const std::exception& e) {
    finish();
    if (superseded) {
      throw ConnectionError(fmt::format(
          "joining generation {} was given up: the agent announced generation {} meanwhile (a "
          "rank died during the re-form): {}",
          g, g + 1, e.what()));
    }
    throw;
  }
  finish();
  return group;
}

std::unique_ptr<comm::ProcessGroup> join_latest_generation(Store& counter, const std::string& key,
                                                           int rank, int world,
                                                           const ConnectStore& connect,
                                                           const JoinGroup& join,
                                                           int64_t* generation) {
  *generation = current_generation(counter, key);
  for (;;) {
    try {
      return join_generation(counter, key, *generation, rank, world, connect, join);
    } catch (const ConnectionError& e) {
      const int64_t latest = current_generation(counter, key);
      if (latest <= *generation) throw;
      log_warning("{}; joining generation {}", e.what(), latest);
      *generation = latest;
    }
  }
}

RankRecovery::RankRecovery(std::string key, std::shared_ptr<Store> store,
                           comm::ReformableProcessGroup& pg, ConnectStore connect, JoinGroup join,
                           std::chrono::milliseconds verdict_timeout,
                           std::chrono::milliseconds stuck_peer_wait, int64_t generation,
                           ConnectStore watch_connect)
    : key_(std::move(key)),
      store_(std::move(store)),
      pg_(pg),
      connect_(std::move(connect)),
      join_(std::move(join)),
      verdict_timeout_(verdict_timeout),
      stuck_peer_wait_(stuck_peer_wait),
      generation_(generation) {
  if (watch_connect) {
    watch_ = std::make_unique<ReplacementWatch>(key_, generation_, std::move(watch_connect));
  }
}

void RankRecovery::abandon_step_if_replacing() const {
  if (watch_ == nullptr) return;
  const int64_t replaced = watch_->replaced_generation();
  if (replaced <= generation_) return;
  throw ConnectionError(fmt::format(
      "the agent announced generation {}: it re-forms this group (a rank replaced or a node "
      "lost), so the step in progress is abandoned",
      replaced));
}

bool RankRecovery::wait_with_heartbeats(const std::string& key, std::chrono::milliseconds wait) {
  const Clock::time_point deadline = Clock::now() + wait;
  for (;;) {
    heartbeat();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    try {
      store_->wait({key}, std::min(left, kVerdictSlice));
      return true;
    } catch (const TimeoutError&) {
      // the next slice
    }
  }
}

std::string RankRecovery::read_verdict(int64_t g) {
  const std::string key = fmt::format("{}/{}", key_, g);
  // The agent bumps the counter before it sets the verdict: a later generation's may lag.
  if (!wait_with_heartbeats(key, verdict_timeout_)) return "";
  const Bytes verdict = store_->get(key);
  return std::string(verdict.begin(), verdict.end());
}

void RankRecovery::take_new_seat(int64_t g, int64_t world, const std::string& round,
                                 const std::exception_ptr& error) {
  const int old_rank = pg_.rank();
  const int old_world = pg_.size();
  const std::string key = fmt::format("{}/shrink_{}/rank_{}", key_, round, old_rank);
  if (!wait_with_heartbeats(key, verdict_timeout_)) {
    log_error("generation {} shrinks the group to world size {}, but the agent gave this rank "
              "no new rank at {} within {} s: exiting",
              g, world, key, verdict_timeout_.count() / 1000.0);
    std::rethrow_exception(error);
  }
  const Bytes said = store_->get(key);
  const std::string text(said.begin(), said.end());
  int new_rank = -1;
  try {
    size_t used = 0;
    new_rank = std::stoi(text, &used);
    if (used != text.size()) new_rank = -1;
  } catch (const std::exception&) {
  }
  if (new_rank < 0 || new_rank >= world) {
    log_error("the agent's new rank for rank {} at {} is '{}'; expected a number in [0, {}): "
              "exiting",
              old_rank, key, text, world);
    std::rethrow_exception(error);
  }
  pg_.move_to(new_rank, static_cast<int>(world));
  log_warning("generation {} shrinks the group from world size {} to {} (round {}): this worker "
              "goes on as rank {} (was {})",
              g, old_world, world, round, new_rank, old_rank);
}

int64_t RankRecovery::wait_for_verdict(const std::exception_ptr& error) {
  const std::string next = fmt::format("{}/{}", key_, generation_ + 1);
  const std::chrono::milliseconds wait =
      timed_out(error) ? std::min(verdict_timeout_, stuck_peer_wait_) : verdict_timeout_;
  if (!wait_with_heartbeats(next, wait)) {
    log_error(
        "no word from the agent at {} within {} s after the failure: giving up on re-forming "
        "the group",
        next, wait.count() / 1000.0);
    std::rethrow_exception(error);
  }
  // The latest generation: the agent may have replaced more than one rank by now (each bump is
  // a generation; only the newest is joined). Each one between is read in order, so that a
  // shrink among them still moves this worker to its new rank.
  const int64_t latest = store_->add(key_, 0);
  for (int64_t g = generation_ + 1; g <= latest; ++g) {
    const std::string said = read_verdict(g);
    if (said == "replace") continue;
    if (said.rfind("shrink ", 0) == 0) {
      std::istringstream words(said.substr(7));
      int64_t world = 0;
      std::string round, rest;
      if (words >> world >> round && !(words >> rest) && world >= 1 && world <= pg_.size()) {
        take_new_seat(g, world, round, error);
        continue;
      }
    }
    if (said == "restart") {
      log_error("the agent restarts the whole group (generation {}): exiting", g);
    } else {
      log_error("the agent's verdict for generation {} is '{}'; expected replace, restart or "
                "shrink <world size no larger than {}> <round>: exiting",
                g, said, pg_.size());
    }
    std::rethrow_exception(error);
  }
  return latest;
}

void RankRecovery::reform(const std::exception_ptr& error, const Exchange& exchange) {
  const Clock::time_point t0 = Clock::now();
  log_warning("a peer failed ({}); waiting for the agent to replace it or shrink the group "
              "(generation {})",
              what_of(error), generation_ + 1);
  for (;;) {
    const int64_t generation = wait_for_verdict(error);
    generation_ = generation;
    log_debug("verdict replace for generation {} seen {:.0f} ms after the failure", generation,
              ms_since(t0));
    try {
      pg_.replace(
          join_generation(*store_, key_, generation, pg_.rank(), pg_.size(), connect_, join_));
      log_debug("joined generation {} {:.0f} ms after the failure", generation, ms_since(t0));
      if (exchange()) {
        log_info("re-formed the group at generation {} (rank {} of {}) {:.0f} ms after the failure",
                 generation, pg_.rank(), pg_.size(), ms_since(t0));
        return;
      }
      log_warning("the group of generation {} broke during the state exchange; waiting for the "
                  "next generation",
                  generation);
    } catch (const Error& e) {
      if (!is_peer_failure(e)) throw;
      log_warning("joining generation {} failed ({}); waiting for the next generation", generation,
                  e.what());
    }
    pg_.drop();
  }
}

}  // namespace dlaunch::train
