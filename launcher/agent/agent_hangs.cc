#include "launcher/agent/agent_hangs.h"

#include <fmt/format.h>
#include <signal.h>

#include <algorithm>

#include "common/log.h"
#include "launcher/agent/failure_report.h"
#include "launcher/status/node_status.h"
#include "launcher/hang/heartbeat_file.h"
#include "launcher/hang/stack_capture.h"

namespace dlaunch {

namespace {

HangPaceParams pace_params(const LaunchConfig& cfg) {
  HangPaceParams p;
  p.startup = cfg.hang_timeout;
  return p;
}

}  // namespace

HangWatch::HangWatch(AgentContext& agent)
    : agent_(agent),
      timer_(agent.io),
      pace_(pace_params(agent.cfg)),
      probe_(agent.procs, agent.io) {}

void HangWatch::arm() {
  // At most 500 ms: a hang is seen within --hang_timeout + 0.5 s, also for long timeouts. With
  // auto, 100 ms: the learned timeout can be as short as its floor (1 s), and a check slower
  // than the beats lengthens the gaps it records (one stat(2) per worker each time).
  Duration period = agent_.cfg.hang_timeout_auto
                        ? std::chrono::milliseconds(100)
                        : std::clamp<Duration>(agent_.cfg.hang_timeout / 4,
                                               std::chrono::milliseconds(10),
                                               std::chrono::milliseconds(500));
  timer_.expires_after(period);
  const int64_t gen = agent_.state().generation;
  timer_.async_wait([this, gen](const boost::system::error_code& ec) {
    if (ec || !agent_.still(gen, AgentPhase::kRunning)) return;
    check();
    if (agent_.state().phase == AgentPhase::kRunning) arm();
  });
}

void HangWatch::cancel() {
  timer_.cancel();
  probe_.cancel();
}

void HangWatch::observe_pace() {
  if (!agent_.cfg.hang_timeout_auto) return;
  if (pace_generation_ != agent_.group->attempt()) {
    pace_ = HangPace(pace_params(agent_.cfg));
    pace_generation_ = agent_.group->attempt();
  }
  const TimePoint now = agent_.opts.clock->now();
  for (auto& w : agent_.group->workers()) {
    if (!w.running()) continue;
    if (!pace_.observe(w.local_rank, w.pid, agent_.opts.last_beat(w.heartbeat_file), now)) {
      continue;
    }
    // Once the pace is known: rare (the longest gap only grows), and it says why a later hang
    // took as long as it did.
    const HangPace::Timeout t = pace_.timeout(w.local_rank);
    if (!t.learned) continue;
    log_info("--hang_timeout auto: the longest gap between heartbeats is now {:.2f} s (local "
             "rank {}): the hang timeout is now {:.1f} s",
             to_seconds(t.longest_gap), w.local_rank, to_seconds(t.value));
  }
}

Duration HangWatch::timeout_for(const WorkerRecord& w) const {
  if (!agent_.cfg.hang_timeout_auto || pace_generation_ != agent_.group->attempt()) {
    return agent_.cfg.hang_timeout;
  }
  return pace_.timeout(w.local_rank).value;
}

void HangWatch::note_hang_rule(WorkerRecord& w, TimePoint now) const {
  if (!agent_.cfg.hang_timeout_auto) return;
  const HangPace::Timeout t = pace_generation_ == agent_.group->attempt()
                                  ? pace_.timeout(w.local_rank)
                                  : HangPace::Timeout{agent_.cfg.hang_timeout};
  const TimePoint since = std::max(w.started, resumed_);
  const auto beat = agent_.opts.last_beat(w.heartbeat_file);
  w.hang_silence = now - std::max(since, beat.value_or(since));
  w.hang_timeout = t.value;
  w.hang_rule = pace_.describe(t);
}

std::string HangWatch::silence_text(const WorkerRecord& w, bool fixed_rule) const {
  if (w.hang_rule.empty() && !fixed_rule) return fmt::format("{:.1f} s", to_seconds(timeout_for(w)));
  return hang_silence(w, timeout_for(w));
}

HangWatch::Silent HangWatch::silent_workers(TimePoint now) const {
  // Suspects: silent for half the timeout. The rank that got stuck and the ranks that then
  // block in a collective go silent within a step of each other, in either order, so the
  // stuck one may not be over the timeout yet when its first victim is.
  Silent s;
  for (auto& w : agent_.group->workers()) {
    if (!w.running()) continue;
    auto beat = agent_.opts.last_beat(w.heartbeat_file);
    bool from_start = agent_.cfg.hang_timeout_from_start;
    const TimePoint since = std::max(w.started, resumed_);
    const Duration timeout = timeout_for(w);
    if (WorkerGroup::is_hung(since, beat, now, timeout, from_start)) {
      s.hung.push_back(w.local_rank);
    } else if (WorkerGroup::is_hung(since, beat, now, timeout / 2, from_start)) {
      s.suspects.push_back(w.local_rank);
    }
  }
  // The hung first: without stacks to tell, the first hung one is named.
  s.suspects.insert(s.suspects.begin(), s.hung.begin(), s.hung.end());
  return s;
}

void HangWatch::check() {
  if (paused_) return;
  TimePoint now = agent_.opts.clock->now();
  observe_pace();
  Silent s = silent_workers(now);
  mark_silent_cpu(s.suspects);
  if (!s.hung.empty()) start_hang(s, now);
}

void HangWatch::start_hang(const Silent& s, TimePoint now) {
  // The first by index stands as the root cause until the stacks tell who is stuck and who
  // waits for it in a collective (investigate).
  for (int64_t local_rank : s.hung) note_hang_rule(agent_.group->worker(local_rank), now);
  agent_.group->on_hung(s.hung.front(), now, std::chrono::system_clock::now());
  log_hung(s.hung);
  investigate(s.suspects, false);
}

bool HangWatch::investigate_for_peer() {
  if (agent_.cfg.hang_timeout.count() <= 0 || paused_ ||
      agent_.state().phase != AgentPhase::kRunning) {
    return false;
  }
  const TimePoint now = agent_.opts.clock->now();
  observe_pace();
  Silent s = silent_workers(now);
  if (s.suspects.empty()) return false;
  mark_silent_cpu(s.suspects);
  // Past the timeout here too (the check had not looked yet): this node's hang as well.
  if (!s.hung.empty()) {
    start_hang(s, now);
    return true;
  }
  log_warning("local rank(s) {} silent for more than {:.1f} s (half --hang_timeout{}): reading "
              "their stacks and the other nodes' hang verdicts before stopping",
              fmt::join(s.suspects, ", "),
              to_seconds(timeout_for(agent_.group->worker(s.suspects.front())) / 2),
              agent_.cfg.hang_timeout_auto ? " auto" : "");
  investigate(s.suspects, true);
  return true;
}

void HangWatch::log_hung(const std::vector<int64_t>& hung) {
  for (int64_t local_rank : hung) {
    const WorkerRecord& w = agent_.group->worker(local_rank);
    agent_.monitor->events().emit("hang_detected",
                             {{"rank", w.global_rank},
                              {"local_rank", w.local_rank},
                              {"pid", w.pid},
                              {"hang_timeout_seconds", to_seconds(timeout_for(w))}});
    log_error("local rank {} (rank {}, pid {}) is hung: its heartbeat file {} was not touched "
              "for {}{}",
              w.local_rank, w.global_rank, w.pid, w.heartbeat_file, silence_text(w, true),
              cpu_note(w.pid, agent_.opts.clock->now()));
  }
}

void HangWatch::mark_silent_cpu(const std::vector<int64_t>& silent) {
  std::map<int, CpuMark> kept;
  for (int64_t local_rank : silent) {
    const int pid = agent_.group->worker(local_rank).pid;
    if (auto it = silent_cpu_.find(pid); it != silent_cpu_.end()) {
      kept.insert(*it);
    } else if (auto usage = read_proc_usage(pid)) {
      kept[pid] = CpuMark{agent_.opts.clock->now(), usage->cpu_seconds};
    }
  }
  silent_cpu_ = std::move(kept);
}

// A silent worker at full CPU is busy (a long step) or spinning (a collective that polls), not
// asleep: it is still stopped at the timeout, but the report says which, so that a user with
// long steps knows to raise the timeout.
std::string HangWatch::cpu_note(int pid, TimePoint now) const {
  auto it = silent_cpu_.find(pid);
  if (it == silent_cpu_.end()) return "";
  auto usage = read_proc_usage(pid);
  const double wall = to_seconds(now - it->second.at);
  if (!usage || wall <= 0) return "";
  const double cpu = usage->cpu_seconds - it->second.cpu_seconds;
  // A blocked worker uses next to nothing; a spinning one on a loaded host may get a small share
  // of a core, but still far more than that.
  if (cpu >= 0.1 * wall) {
    return fmt::format("; it used {:.1f} s of CPU in its last {:.1f} s of silence: busy or "
                       "spinning; raise --hang_timeout if its steps can take this long",
                       cpu, wall);
  }
  return fmt::format("; it used {:.1f} s of CPU in its last {:.1f} s of silence: blocked", cpu,
                     wall);
}

HangInvestigation::Options HangWatch::capture_options() const {
  HangInvestigation::Options o;
  for (const auto& [k, v] : agent_.opts.base_env) {
    if (k == "PATH") o.path_env = v;
  }
  if (o.path_env.empty()) o.path_env = "/usr/local/bin:/usr/bin:/bin";
  o.env = agent_.opts.base_env;
  o.timeout = agent_.opts.stack_capture_timeout;
  return o;
}

void HangWatch::investigate(const std::vector<int64_t>& suspects, bool for_peer) {
  if (!agent_.opts.capture_stacks) return blame(suspects, {}, for_peer);
  HangInvestigation::Options o = capture_options();
  if (stack_capture_command(0, o.path_env).empty()) {
    log_warning("no native stacks of the hung workers: neither eu-stack (elfutils) nor gdb is "
                "installed; install one of them to get stacks (see docs/troubleshooting.md)");
  }
  // Every silent worker, victims too: their stacks show what they wait for. Workers that still
  // beat are not part of the hang (and each native capture takes a while: gdb, seconds).
  std::vector<HangInvestigation::Target> targets;
  for (int64_t local_rank : suspects) {
    const WorkerRecord& w = agent_.group->worker(local_rank);
    targets.push_back({w.local_rank, w.global_rank, w.pid, w.log_dir});
  }
  agent_.post({Event::Kind::kCaptureStarted});
  const int64_t gen = agent_.state().generation;
  probe_.start(std::move(targets), std::move(o),
               [this, gen, suspects, for_peer](std::vector<HangInvestigation::Result> results) {
                 if (!agent_.still(gen, AgentPhase::kCapturing)) return;
                 blame(suspects, results, for_peer);
               });
}

void HangWatch::blame(const std::vector<int64_t>& suspects,
                      const std::vector<HangInvestigation::Result>& results, bool for_peer) {
  // Capturing until the verdict is final (end()); also without stacks.
  agent_.post({Event::Kind::kCaptureStarted});
  HangVerdict v = judge_hang(suspects, results);
  for (const auto& r : results) {
    WorkerRecord& w = agent_.group->worker(r.target.local_rank);
    w.hang_where = r.finding.where;
    w.python_stack = r.finding.python_stack;
  }
  if (for_peer) {
    // What each silent worker does (one line per stack read), not a verdict: this node's
    // workers were not past --hang_timeout, and the exchange below says who is stuck.
    for (size_t i = 0; i < results.size() && i < v.log.size(); ++i) log_warning("{}", v.log[i]);
  } else {
    for (const auto& line : v.log) log_error("{}", line);
  }
  agent_.group->blame_hang(v.root);
  note_hang_rule(agent_.group->worker(v.root), agent_.opts.clock->now());
  // Before stopping: compare with the other nodes, so a rank stuck on another node is named
  // instead of a local victim (hang_exchange.h; at most kHangExchangeWait, off the loop).
  const WorkerRecord& w = agent_.group->worker(v.root);
  const auto& round = agent_.last_round;
  HangExchangeRequest req{round ? round->round : 0, round ? round->group_world_size : 1,
                          node_hang_verdict(v, round ? round->group_rank : 0, agent_.opts.host,
                                            w.global_rank, w.pid, w.log_dir)};
  // Asked by a peer, before any worker here passed --hang_timeout: the hang is not this node's
  // to claim, and the peer's verdict is what to read (it was written before its request).
  if (for_peer) req.mine.stuck_here = false;
  // Stuck here and announced: this node will most likely replace it alone (offer_replacement),
  // and says so, so that the other nodes' silent ranks wait for the re-formed group.
  req.mine.replaceable = req.mine.stuck_here && agent_.recovery.on() &&
                         announced_rank_recovery(w.heartbeat_file);
  const int64_t gen = agent_.state().generation;
  start_hang_exchange(
      round ? round->store : nullptr, req,
      [g = agent_.gate](std::function<void()> f) { post_from_thread(g, std::move(f)); },
      [this, gen, for_peer](std::optional<NodeHangVerdict> root) {
        if (gen == agent_.state().generation) end(root, for_peer);
      });
}

void HangWatch::end(const std::optional<NodeHangVerdict>& elsewhere, bool for_peer) {
  agent_.stuck_elsewhere = elsewhere;
  if (elsewhere) {
    log_error("root cause of the hang: {}; the silent ranks here wait in a collective for it",
              describe_remote_hang_root(*elsewhere));
  }
  if (!elsewhere && !for_peer && offer_replacement()) return;
  const WorkerRecord& w = agent_.group->worker(agent_.group->root_cause().value_or(0));
  Event verdict{elsewhere && elsewhere->replaceable ? Event::Kind::kHangReplacedElsewhere
                                                    : Event::Kind::kHangVerdict};
  verdict.flag = for_peer;
  verdict.text = elsewhere ? fmt::format("the ranks on {} hung waiting for {}", agent_.opts.host,
                                         describe_remote_hang_root(*elsewhere))
                           : fmt::format("rank {} on {} hung (no heartbeat for {}){}{}",
                                         w.global_rank, agent_.opts.host, silence_text(w, false),
                                         w.hang_where.empty() ? "" : " in ", w.hang_where);
  agent_.post(verdict);
}

bool HangWatch::offer_replacement() {
  if (!agent_.recovery.on() || !agent_.group->root_cause()) return false;
  const int64_t local_rank = *agent_.group->root_cause();
  const WorkerRecord& w = agent_.group->worker(local_rank);
  Event hung{Event::Kind::kRankFailed};
  hung.hung = true;
  hung.count = local_rank;
  hung.flag = announced_rank_recovery(w.heartbeat_file);
  hung.in_flight = replacement_in_flight(*agent_.group, agent_.opts.last_beat);
  hung.text = fmt::format("rank {} (local {}, pid {}) hung (no heartbeat for {}){}{}",
                          w.global_rank, local_rank, w.pid, silence_text(w, false),
                          w.hang_where.empty() ? "" : " in ", w.hang_where);
  for (const Action& a : agent_.post(hung)) {
    if (a.kind == Action::Kind::kReplaceRank) return true;
  }
  return false;
}

// Workers silent for longer than --hang_timeout get SIGKILL at once, before the others'
// SIGTERM: stuck (or stopped) they cannot act on SIGTERM, their stacks are already taken, and
// waiting --shutdown_grace for them only delays the restart. Their peers, blocked in a
// collective with them, then fail at once as the sockets close. Every stop does this (the
// kStopGroup action): a peer's restart request can come while this node still takes its own
// hung workers' stacks (a chaos soak: a SIGSTOPped worker then got --shutdown_grace).
void HangWatch::kill_silent_workers() {
  if (agent_.cfg.hang_timeout.count() <= 0) return;
  const TimePoint now = agent_.opts.clock->now();
  for (auto& w : agent_.group->workers()) {
    if (!w.running() || w.pid <= 0) continue;
    auto beat = agent_.opts.last_beat(w.heartbeat_file);
    const TimePoint since = std::max(w.started, resumed_);
    if (w.hung || WorkerGroup::is_hung(since, beat, now, timeout_for(w),
                                       agent_.cfg.hang_timeout_from_start)) {
      agent_.procs.signal_group(w.pid, SIGKILL);
    }
  }
}

}  // namespace dlaunch
