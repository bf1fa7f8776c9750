#include "launcher/agent/agent_stopping.h"

#include <fmt/format.h>
#include <signal.h>

#include "common/log.h"
#include "launcher/agent/agent_core.h"

namespace dlaunch {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

}  // namespace

GroupStopper::GroupStopper(AgentCore& agent)
    : agent_(agent), grace_timer_(agent.io), kill_timer_(agent.io) {}

void GroupStopper::after(boost::asio::steady_timer& timer, Duration delay,
                         std::function<void()> then) {
  const int64_t gen = agent_.generation;
  timer.expires_after(delay);
  timer.async_wait([this, gen, then](const boost::system::error_code& ec) {
    if (!ec && gen == agent_.generation && agent_.phase == AgentPhase::kStopping) then();
  });
}

void GroupStopper::stop(int first) {
  stop_started_ = agent_.opts.clock->now();
  agent_.hangs.kill_silent_workers();
  for (auto& w : agent_.group->workers()) {
    if (w.running()) agent_.procs.signal_group(w.pid, first);
  }
  after(grace_timer_, agent_.cfg.shutdown_grace, [this]() { kill_now(); });
}

// Every worker exited 0 but left processes running (an uploader started with Popen, a daemon).
// torchrun lets them run on as orphans; dlaunch leaves no orphan, but it does not kill them
// unannounced either: SIGTERM, up to --shutdown_grace to end, then SIGKILL, each step logged at
// warning level with what it hits.
void GroupStopper::stop_leftovers() {
  // Signal 0: pinned and watched, not signalled yet. What ends within the grace was never
  // touched (an uploader finishing its upload), as torchrun, which does not wait at all,
  // would have let it finish.
  std::vector<std::string> left = agent_.procs.signal_leftovers(0, on_leftovers_gone());
  if (left.empty()) return agent_.group_stopped();
  leftovers_pending_ = true;
  stop_started_ = agent_.opts.clock->now();
  log_warning("the workers exited 0 but left {} process(es) running: {}; letting them finish "
              "for up to {:.1f} s (--shutdown_grace), then SIGTERM, then SIGKILL",
              left.size(), join(left), to_seconds(agent_.cfg.shutdown_grace));
  after(grace_timer_, agent_.cfg.shutdown_grace, [this]() { term_leftovers(); });
}

void GroupStopper::term_leftovers() {
  std::vector<std::string> left = agent_.procs.signal_leftovers(SIGTERM, on_leftovers_gone());
  if (left.empty()) return kill_leftovers();
  log_warning("{} process(es) the workers left still run {:.1f} s after the workers exited: "
              "{}; sending SIGTERM, SIGKILL in {:.1f} s (let the workers wait for them, or "
              "raise --shutdown_grace)",
              left.size(), to_seconds(agent_.opts.clock->now() - stop_started_), join(left),
              to_seconds(agent_.opts.kill_wait));
  after(grace_timer_, agent_.opts.kill_wait, [this]() { kill_leftovers(); });
}

std::function<void()> GroupStopper::on_leftovers_gone() {
  const int64_t gen = agent_.generation;
  return [this, gen]() {
    if (gen != agent_.generation || agent_.phase != AgentPhase::kStopping || !leftovers_pending_)
      return;
    leftovers_pending_ = false;
    grace_timer_.cancel();
    log_info("the processes the workers left have ended");
    agent_.group_stopped();
  };
}

void GroupStopper::kill_leftovers() {
  grace_timer_.cancel();
  leftovers_pending_ = false;
  std::vector<std::string> left = agent_.procs.live_leftovers();
  if (!left.empty()) {
    log_warning("{} process(es) the workers left still run {:.1f} s after the workers exited: "
                "{}; sending SIGKILL",
                left.size(), to_seconds(agent_.opts.clock->now() - stop_started_), join(left));
  }
  agent_.group_stopped();
}

void GroupStopper::kill_now() {
  if (leftovers_pending_) return kill_leftovers();
  grace_timer_.cancel();
  // The real time since the stop signal: the grace when it ran out, less after a second Ctrl-C.
  const double elapsed = to_seconds(agent_.opts.clock->now() - stop_started_);
  for (auto& w : agent_.group->workers()) {
    if (!w.running()) continue;
    log_warning("local rank {} (pid {}) still runs {:.1f} s after the stop signal; sending "
                "SIGKILL",
                w.local_rank, w.pid, elapsed);
    agent_.procs.signal_group(w.pid, SIGKILL);
  }
  after(kill_timer_, agent_.opts.kill_wait, [this]() { abandon_survivors(); });
}

void GroupStopper::abandon_survivors() {
  for (auto& w : agent_.group->workers()) {
    if (!w.running()) continue;
    std::string state = agent_.procs.process_state(w.pid);
    log_error("local rank {} (pid {}) did not die {:.1f} s after SIGKILL (state {}{}); not "
              "waiting for it",
              w.local_rank, w.pid, to_seconds(agent_.opts.kill_wait), state.empty() ? "?" : state,
              state == "D" ? ": uninterruptible sleep, usually a stuck device or file system"
                           : "");
    agent_.stuck.push_back(fmt::format("pid {} (local rank {}, state {})", w.pid, w.local_rank,
                                  state.empty() ? "?" : state));
    agent_.group->on_abandoned(w.local_rank);
  }
  agent_.group_stopped();
}

void GroupStopper::cancel() {
  grace_timer_.cancel();
  kill_timer_.cancel();
}

}  // namespace dlaunch
