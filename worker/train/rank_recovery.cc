#include "worker/train/rank_recovery.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/env.h"
#include "common/error.h"
#include "common/heartbeat.h"
#include "common/log.h"

namespace dlaunch::train {

namespace {

using Clock = std::chrono::steady_clock;

// A survivor's wait for the agent's verdict is cut into slices, each followed by a heartbeat: a
// worker waiting for its peer's replacement is not hung (--hang_timeout).
constexpr std::chrono::milliseconds kVerdictSlice{1000};

std::string what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
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

RankRecovery::RankRecovery(std::string key, std::shared_ptr<Store> store,
                           comm::ReformableProcessGroup& pg, Join join,
                           std::chrono::milliseconds verdict_timeout, int64_t generation)
    : key_(std::move(key)),
      store_(std::move(store)),
      pg_(pg),
      join_(std::move(join)),
      verdict_timeout_(verdict_timeout),
      generation_(generation) {}

std::pair<int64_t, bool> RankRecovery::wait_for_verdict(const std::exception_ptr& error) {
  const std::string next = fmt::format("{}/{}", key_, generation_ + 1);
  const Clock::time_point deadline = Clock::now() + verdict_timeout_;
  for (;;) {
    heartbeat();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      log_error(
          "no word from the agent at {} within {} s after the failure: giving up on re-forming "
          "the group",
          next, verdict_timeout_.count() / 1000);
      std::rethrow_exception(error);
    }
    try {
      store_->wait({next}, std::min(left, kVerdictSlice));
      break;
    } catch (const TimeoutError&) {
      // the next slice
    }
  }
  // The latest generation: the agent may have replaced more than one rank by now (each bump is
  // a generation; only the newest is joined).
  const int64_t latest = store_->add(key_, 0);
  const Bytes verdict = store_->get(fmt::format("{}/{}", key_, latest));
  const std::string said(verdict.begin(), verdict.end());
  if (said == "replace") return {latest, true};
  if (said != "restart") {
    log_error("the agent's verdict for generation {} is '{}'; expected replace or restart",
              latest, said);
  }
  return {latest, false};
}

void RankRecovery::reform(const std::exception_ptr& error, const Exchange& exchange) {
  const Clock::time_point t0 = Clock::now();
  log_warning("a peer failed ({}); waiting for the agent to replace it (generation {})",
              what_of(error), generation_ + 1);
  for (;;) {
    const auto [generation, replace] = wait_for_verdict(error);
    if (!replace) {
      log_error("the agent restarts the whole group (generation {}): exiting", generation);
      std::rethrow_exception(error);
    }
    generation_ = generation;
    try {
      pg_.replace(join_(generation));
      if (exchange()) {
        log_info("re-formed the group at generation {} {:.0f} ms after the failure", generation,
                 ms_since(t0));
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
