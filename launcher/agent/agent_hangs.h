// Hung workers (--hang_timeout): a periodic check of the heartbeat files while the workers
// run, then the stacks of every silent worker (hang_investigation.h), the diagnosis of which one
// is stuck outside a collective (judge_hang), SIGKILL for the silent ones and the group stopped.
// Loop thread only.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <optional>
#include <vector>

#include "common/clock.h"
#include "launcher/agent/agent_context.h"
#include "launcher/hang/hang_exchange.h"
#include "launcher/hang/hang_investigation.h"
#include "launcher/hang/hang_pace.h"

namespace dlaunch {

class HangWatch {
 public:
  explicit HangWatch(AgentContext& agent);

  // Checks the heartbeats every min(--hang_timeout / 4, 500 ms) while the workers run; with
  // --hang_timeout auto every 100 ms, so that the gaps it learns are close to the real ones.
  void arm();
  // The group is being stopped: no more checks.
  void stop_checks() { timer_.cancel(); }
  // The job ends: no more checks and no capture in progress.
  void cancel();
  // SIGKILL for the workers silent past --hang_timeout; every stop of the group starts with it
  // (the kStopGroup action).
  void kill_silent_workers();
  // Another node asked for a restart while workers here are silent (for half --hang_timeout or
  // more): they most likely wait in a collective for a rank that hung on that node, whose agent
  // saw it first and wrote its verdict before asking. Their stacks and the hang exchange come
  // first (bounded, as for a hang seen here), so this node's report names the stuck rank as the
  // others' do; then the group is stopped. False when no worker here is silent: the caller
  // stops the group at once.
  bool investigate_for_peer();
  // The workers are being stopped (SIGTSTP): no verdicts until resumed(). After the agent's own
  // stop a due check may run before the SIGCONT handler does.
  void pause() { paused_ = true; }
  // The workers go on from `now` (SIGCONT): the time they spent stopped is no silence of theirs,
  // so the hang clock starts again from here.
  // With --hang_timeout auto, the silence up to the next beat is not learned either: the
  // survivors' wait in the collective during a hang is no pace of theirs.
  void resumed(TimePoint now) {
    paused_ = false;
    resumed_ = now;
    pace_.skip_current_gaps();
  }
  // A rank is replaced alone: the others' silence while they waited for it (in the collective
  // it broke, then in the re-form) is not learned as a gap (--hang_timeout auto).
  void rank_replaced() { pace_.skip_current_gaps(); }

 private:
  AgentContext& agent_;
  boost::asio::steady_timer timer_;
  TimePoint resumed_{};  // the last SIGCONT; silence is counted from it at the earliest
  bool paused_ = false;
  // --hang_timeout auto: the pace of this generation's workers (a new generation starts over).
  HangPace pace_;
  int64_t pace_generation_ = -1;
  // Reads every running worker's heartbeat into pace_ (auto only).
  void observe_pace();
  // The timeout `w` is judged by now: --hang_timeout, or with auto the learned (or start-up) one.
  Duration timeout_for(const WorkerRecord& w) const;
  // With auto: keeps in `w` how long it was silent now, the timeout it passed and why, for the
  // report (a survivor of an earlier hang carries that one's until then); nothing with a fixed
  // timeout.
  void note_hang_rule(WorkerRecord& w, TimePoint now) const;
  // With auto "1.3 s, more than 1.0 s (--hang_timeout auto: ...)"; with a fixed timeout
  // "more than 6.0 s (--hang_timeout)" when `fixed_rule`, else "6.0 s".
  std::string silence_text(const WorkerRecord& w, bool fixed_rule) const;
  // A silent worker's CPU time when it was first seen silent (a suspect), by pid: the verdict
  // says whether it then spun or slept.
  struct CpuMark {
    TimePoint at;
    double cpu_seconds = 0;
  };
  std::map<int, CpuMark> silent_cpu_;

  // Keeps silent_cpu_ for exactly the silent workers.
  void mark_silent_cpu(const std::vector<int64_t>& silent);
  // ", using C s of CPU in its last W s: busy or spinning; ..." or "" when not measured.
  std::string cpu_note(int pid, TimePoint now) const;
  HangInvestigation probe_;  // hung workers' stacks and diagnosis (phase kCapturing)

  // Who is hung: the workers silent past --hang_timeout, then those silent for half of it
  // (suspects), each by local rank.
  struct Silent {
    std::vector<int64_t> hung, suspects;
  };
  Silent silent_workers(TimePoint now) const;
  void check();
  // Workers are past --hang_timeout: the first hung one is the root cause until the stacks
  // tell otherwise; investigate.
  void start_hang(const Silent& s, TimePoint now);
  void log_hung(const std::vector<int64_t>& hung);
  // `for_peer`: started by another node's restart request (investigate_for_peer), not by a
  // hang seen here.
  void investigate(const std::vector<int64_t>& suspects, bool for_peer);
  HangInvestigation::Options capture_options() const;
  // Names the silent rank that is stuck outside a collective as the root cause (judge_hang),
  // tells the other nodes and stops the group.
  void blame(const std::vector<int64_t>& suspects,
             const std::vector<HangInvestigation::Result>& results, bool for_peer);
  // The hung worker announced rank_recovery: offers step() to replace it alone (the rest go on);
  // true when it does.
  bool offer_replacement();
  // The hang's verdict is final: tell the other nodes and stop the group (unless a request from
  // elsewhere stopped it meanwhile; the report still names the rank stuck elsewhere).
  void end(const std::optional<NodeHangVerdict>& elsewhere, bool for_peer);
};

}  // namespace dlaunch
