#include "launcher/agent/agent_step.h"

#include <fmt/format.h>
#include <signal.h>

#include "launcher/agent/exit_codes.h"
#include "launcher/process/exit_status.h"

namespace dlaunch {

const char* agent_phase_name(AgentPhase p) {
  switch (p) {
    case AgentPhase::kRendezvous:
      return "rendezvous";
    case AgentPhase::kRunning:
      return "running";
    case AgentPhase::kCapturing:
      return "capturing_stacks";
    case AgentPhase::kStopping:
      return "stopping";
    case AgentPhase::kExitBarrier:
      return "exit_barrier";
    case AgentPhase::kDone:
      return "done";
  }
  return "?";
}

namespace {

using A = Action::Kind;
using E = Event::Kind;
using P = AgentPhase;

// One step's work, in layers by concern: the state it changes and the actions it gathers, in
// order; starting, stopping and ending a generation (with decide()); then the rendezvous's
// events, the signals, and the rest with the dispatch on the event's kind (Stepper).
struct GenerationSteps {
  AgentState s;
  std::vector<Action> out;

  void act(A kind, int code = 0, std::string text = {}) {
    Action a{kind};
    a.code = code;
    a.text = std::move(text);
    out.push_back(std::move(a));
  }
  void say(A level, std::string text) { act(level, 0, std::move(text)); }
  void with_signal(A kind, int sig) {
    Action a{kind};
    a.signal = sig;
    out.push_back(std::move(a));
  }
  bool working() const { return s.phase == P::kRunning || s.phase == P::kCapturing; }

  void begin_generation() {
    s.phase = P::kRendezvous;
    act(A::kBeginGeneration);
  }

  // Stops the group with `first` unless it is stopping already or the job is over. Workers that
  // opted in to rank recovery learn first that no rank is coming back (the verdict `restart`),
  // so a survivor waiting for a replacement exits at once instead of at its join timeout; a
  // lost store cannot carry it.
  void stop(int first) {
    if (s.phase == P::kStopping || s.phase == P::kDone) return;
    s.phase = P::kStopping;
    if (s.rank_recovery && !s.cause.is(StopKind::kStoreLost)) act(A::kAnnounceRestart);
    with_signal(A::kStopGroup, first);
  }

  void finish_now(int code) {
    if (s.phase == P::kDone) return;
    s.phase = P::kDone;
    s.exit_code = code;
    act(A::kFinishNow, code);
  }

  // Ends the job with `code`; a success of several nodes sharing a store first passes the exit
  // barrier (torchrun's), so the store's host does not take it away while others still use it.
  void finish(int code) {
    if (s.phase == P::kDone) return;
    act(A::kCancelTimers);
    if (code == exit_codes::kSuccess && s.multi_node && s.exit_barrier_due) {
      s.phase = P::kExitBarrier;
      act(A::kStartExitBarrier);
      return;
    }
    finish_now(code);
  }

  // decide()'s answer, carried out. `node_lost`: the rendezvous's sentence for a lost node.
  void carry_out(const DecisionInput& in, const Decision& d, const std::string& node_lost = {}) {
    switch (d.action) {
      case Decision::Action::kFinish: {
        Action why{A::kSayWhyFinished};
        why.code = d.exit_code;
        why.count = static_cast<int64_t>(in.cause.kind);
        why.signal = in.cause.signal;
        out.push_back(why);
        if (d.report) {
          Action report{A::kReportFailure};
          report.count = in.restarts_used;
          out.push_back(report);
        }
        return finish(d.exit_code);
      }
      case Decision::Action::kRestart: {
        Action restart{A::kRecordRestart};
        restart.flag = d.counted;
        restart.count = in.restarts_used;
        if (d.counted) {
          ++s.restarts_used;
        } else {
          restart.text = node_lost;
        }
        out.push_back(restart);
        return begin_generation();
      }
      case Decision::Action::kRejoin:
        return begin_generation();
      case Decision::Action::kSettle:
        // The verdict completes the input as it is now: events that arrive while it is
        // awaited (a store lost) concern the next round.
        s.settling = true;
        s.settling_after_success = false;
        s.settling_input = in;
        act(A::kSettle);
        return;
    }
  }

  DecisionInput decision_input(GroupState group) const {
    DecisionInput in;
    in.group = group;
    in.cause = s.cause;
    in.restarts_used = s.restart_count();
    in.max_restarts = s.max_restarts;
    in.multi_node = s.multi_node;
    return in;
  }

  // Only a group being stopped goes down (a success stops what its workers left).
  void group_down(GroupState group) {
    if (s.phase != P::kStopping) return;
    act(A::kCollectGroup);
    DecisionInput in = decision_input(group);
    const Decision d = decide(in);
    const std::optional<AgentState::PendingRound> pending = s.pending_round;
    s.pending_round.reset();
    // The rendezvous failed with the workers kept, and nothing stronger came meanwhile.
    if (s.exit_after_stop && s.cause.kind == StopKind::kNone) return finish(*s.exit_after_stop);
    if (pending && d.action == Decision::Action::kRejoin) {
      // The round formed while the kept group stopped: it is this generation's.
      s.phase = P::kRendezvous;
      Event formed{Event::Kind::kRoundFormed};
      formed.count = pending->restart_count;
      formed.flag = pending->exit_barrier_due;
      return round_formed(formed);
    }
    carry_out(in, d);
  }

  void round_formed(const Event& e) {
    ++s.generation;
    s.round_restarts = e.count;
    s.round_replacements = 0;
    s.exit_barrier_due = e.flag;
    s.cause.new_generation();
    act(A::kStartWorkers);
  }

  void worker_exited(const Event& e) {
    if (e.group == GroupState::kSucceeded && s.phase == P::kRunning) {
      // After a preemption notice a worker that checkpointed and exited 0 (dtrain) finished
      // nothing: say what happened; the decision reports the preemption.
      say(A::kLogInfo, s.cause.is(StopKind::kPreempted)
                           ? fmt::format("all {} worker(s) stopped cleanly after the preemption "
                                         "notice",
                                         e.count)
                           : fmt::format("all {} worker(s) finished successfully", e.count));
      s.phase = P::kStopping;
      act(A::kStopLeftovers);
      return;
    }
    if (s.phase == P::kStopping && e.all_exited) group_down(e.group);
  }
};

// What the rendezvous pushes while the workers run or wait at the exit barrier, and the verdict
// on a failure.
struct PeerSteps : GenerationSteps {
  void peer_event(const Event& e) {
    if (s.phase == P::kExitBarrier) return peer_event_after_success(e);
    if (!working()) return;
    switch (e.peer) {
      case Event::Peer::kMembershipChanged: {
        const std::string why_not = shrink_refused(e);
        if (why_not.empty()) return keep_workers(e);
        say(A::kLogWarning,
            fmt::format("membership changed: {}; restarting the workers (not counted as a "
                        "restart){}",
                        e.text, why_not == "-" ? "" : "; not re-formed in process: " + why_not));
        s.cause.record(StopKind::kMembershipChange);
        act(A::kStopRequested, 0, "membership changed: " + e.text);
        return stop(SIGTERM);
      }
      case Event::Peer::kRestartRequested:
        say(A::kLogWarning, "another node asked for a restart: " + e.text);
        act(A::kStopRequested, 0, "restart requested by another node: " + e.text);
        s.cause.record(StopKind::kPeerRestart);
        // Mid-hang (another node saw it first): read the stacks and compare the verdicts
        // first, which is bounded; the hang's verdict stops the group. The same when workers
        // here are silent but not yet past --hang_timeout (the stuck rank's node saw it first).
        if (s.phase == P::kCapturing) return;
        act(A::kInvestigateForPeer);
        return;
      case Event::Peer::kShutdownRequested:
        say(A::kLogInfo, "the job is shutting down: " + e.text);
        act(A::kStopRequested, 0, "shutdown requested: " + e.text);
        s.cause.record(StopKind::kPeerShutdown);
        return stop(SIGTERM);
    }
  }

  // Why a membership change does not keep the workers here for an in-process shrink: "" when
  // it does, "-" when there is nothing to say (no node was lost, or no rank recovery here).
  std::string shrink_refused(const Event& e) const {
    if (!e.flag || !s.rank_recovery || !s.multi_node) return "-";
    if (s.cause.kind != StopKind::kNone || s.cause.signal != 0 || s.settling ||
        !s.store_lost.empty()) {
      return "the job is being stopped";
    }
    if (!e.announced) {
      return "not every worker here announced rank_recovery (or one has ended)";
    }
    if (e.in_flight) return "a replacement on this node has not beaten yet";
    return "";
  }

  // A node was lost and every worker here can re-form in process: a new round with the
  // workers kept. They are silent meanwhile (waiting for the verdict): the hang checks run only
  // in kRunning, and a hang being investigated was that wait.
  void keep_workers(const Event& e) {
    s.keeping_workers = true;
    s.kept_group_broken = false;
    s.lost_node = e.text;
    if (s.phase == P::kCapturing) act(A::kForgiveHang);
    s.phase = P::kRendezvous;
    say(A::kLogWarning,
        fmt::format("membership changed: {}; every worker here announced rank_recovery: "
                    "re-rendezvousing with the workers kept (not counted as a restart)",
                    e.text));
    act(A::kRendezvousKeepingWorkers);
  }

  // The round after a loss, formed while the workers were kept: it shrinks the group in place
  // when it holds exactly the nodes that kept theirs, the group is intact and the job-wide
  // restart count did not move (the workers' recovery key would); else the group is stopped,
  // the workers that opted in told `restart`, and started again in this round, as after any
  // membership change.
  void round_formed_keeping(const Event& e) {
    s.keeping_workers = false;
    std::string why_not;
    if (!e.every_node_kept) {
      why_not = "the round does not hold exactly the nodes that kept their workers";
    } else if (s.kept_group_broken) {
      why_not = "a worker here ended meanwhile";
    } else if (!s.round_restarts || e.count != *s.round_restarts) {
      why_not = "a failure elsewhere was counted meanwhile";
    }
    if (why_not.empty()) {
      s.phase = P::kRunning;
      s.exit_barrier_due = e.flag;
      act(A::kShrink, 0, s.lost_node);
      // Their silence so far was the wait for this round.
      act(A::kResumeHangChecks);
      if (s.hang_checks) act(A::kArmHangChecks);
      return;
    }
    say(A::kLogWarning, fmt::format("the new round cannot shrink the worker group in place ({}); "
                                    "restarting it in that round (not counted as a restart)",
                                    why_not));
    s.pending_round = AgentState::PendingRound{e.count, e.flag};
    s.cause.record(StopKind::kMembershipChange);
    act(A::kStopRequested, 0, "membership changed: " + s.lost_node);
    s.phase = P::kRunning;
    stop(SIGTERM);
  }

  // The round could not form while the workers were kept: they are stopped first.
  void round_failed_keeping(int code) {
    s.keeping_workers = false;
    s.exit_after_stop = code;
    s.phase = P::kRunning;
    act(A::kStopRequested, 0, "the rendezvous after a lost node failed");
    stop(SIGTERM);
  }

  // What may arrive while the round forms with the workers kept; false: as in any round.
  bool while_keeping(const Event& e) {
    switch (e.kind) {
      case E::kRoundFormed:
        round_formed_keeping(e);
        return true;
      case E::kRoundFailed:
        round_failed_keeping(e.code);
        return true;
      case E::kJobFinishedElsewhere:
        round_failed_keeping(exit_codes::kWorkersFailed);
        return true;
      case E::kWorkerFailed:
      case E::kWorkerExited:
      case E::kExecFailed:
      case E::kRankFailed:
        if (!s.kept_group_broken) {
          say(A::kLogWarning, "a worker ended while the nodes re-form: the group restarts in "
                              "the new round instead of shrinking in place");
        }
        s.kept_group_broken = true;
        return true;
      case E::kStoreLost:
        s.keeping_workers = false;
        s.phase = P::kRunning;  // the workers run: stop them
        return false;
      case E::kSignal:
        if (e.signal == SIGCHLD || e.signal == SIGTSTP || e.signal == SIGCONT ||
            e.signal == SIGUSR1 || e.signal == SIGUSR2) {
          return false;
        }
        s.keeping_workers = false;
        s.phase = P::kRunning;  // the workers run: stop them
        return false;
      default:
        return false;
    }
  }

  // Our workers are done, others' are not: a failure elsewhere restarts everyone (the
  // job-wide budget permitting), a closed rendezvous means the job failed elsewhere.
  void peer_event_after_success(const Event& e) {
    if (e.peer == Event::Peer::kRestartRequested) {
      // A node lost makes the others' workers fail: that rejoin is free (the verdict).
      s.settling = true;
      s.settling_after_success = true;
      s.peer_failure = e.text;
      act(A::kSettle);
      return;
    }
    if (e.peer == Event::Peer::kShutdownRequested) {
      say(A::kLogError,
          "the job was closed by another node while this node waited: " + e.text);
      finish_now(exit_codes::kWorkersFailed);
    }
  }

  // No round can form again, so stop the workers and exit with the handler's sentence. In the
  // rendezvous phase the round itself fails with that sentence; while a failure is being
  // settled, the verdict carries it.
  void store_lost(const Event& e) {
    if (s.phase == P::kDone || !s.store_lost.empty()) return;
    s.store_lost = e.text;
    s.cause.record(StopKind::kStoreLost);
    if (s.phase == P::kExitBarrier) {
      say(A::kLogError, e.text);
      return finish_now(exit_codes::kWorkersFailed);
    }
    if (working()) {
      act(A::kStopRequested, 0, e.text);
      stop(SIGTERM);
    }
  }

  void verdict(const Event& e) {
    if (e.generation != s.generation || s.phase == P::kDone || !s.settling) return;
    s.settling = false;
    if (s.cause.is(StopKind::kPreempted) && s.phase != P::kExitBarrier) {
      DecisionInput in = s.settling_input;
      in.cause = s.cause;
      in.restarts_used = s.restart_count();
      return carry_out(in, decide(in));  // exits 75
    }
    if (e.verdict == Event::Verdict::kStoreLost) {
      s.store_lost = e.text;
      s.cause.record(StopKind::kStoreLost);
      say(A::kLogError, e.text);
      return finish(exit_codes::kWorkersFailed);
    }
    if (s.settling_after_success) return rejoin_after_success(e);
    DecisionInput in = s.settling_input;
    in.verdict = e.verdict == Event::Verdict::kNodeLost ? FailureVerdictInput::kNodeLost
                                                        : FailureVerdictInput::kCounted;
    carry_out(in, decide(in), e.text);
  }

  void rejoin_after_success(const Event& e) {
    if (e.verdict == Event::Verdict::kNodeLost) {
      say(A::kLogWarning,
          fmt::format("{}; rejoining the remaining nodes (not counted as a restart)", e.text));
      return begin_generation();
    }
    if (s.restart_count() < s.max_restarts) {
      say(A::kLogWarning, fmt::format("another node failed after this node's workers finished "
                                      "({}); rejoining for the job-wide restart",
                                      s.peer_failure));
      ++s.restarts_used;
      act(A::kRecordPeerFailure, 0, s.peer_failure);
      return begin_generation();
    }
    say(A::kLogError, fmt::format("another node failed ({}) and the restart budget ({}) is spent",
                                  s.peer_failure, s.max_restarts));
    finish_now(exit_codes::kWorkersFailed);
  }
};

// The signals dlaunch receives (agent_signals.h), `dlaunch stop` among them.
struct SignalSteps : PeerSteps {
  void signal(const Event& e) {
    const int sig = e.signal;
    if (sig == SIGCHLD) return act(A::kReapOrphans);
    if (sig == SIGTSTP) {
      // The workers lead their own process groups, so the terminal's Ctrl-Z would stop dlaunch
      // alone while they train on: pass it on, then stop as the default action would have.
      say(A::kLogInfo,
          "received SIGTSTP; stopping the workers and dlaunch (fg or SIGCONT resumes them)");
      act(A::kPauseHangChecks);
      with_signal(A::kForward, SIGTSTP);
      act(A::kStopSelf);
      return;
    }
    if (sig == SIGCONT) {
      act(A::kResumeHangChecks);
      with_signal(A::kForward, SIGCONT);
      say(A::kLogInfo, "received SIGCONT; the workers go on");
      return;
    }
    if (s.phase == P::kDone) return;
    if (e.text.empty()) {
      Action a{A::kTimeline};
      a.text = "signal_received";
      a.signal = sig;
      out.push_back(a);
    }
    const bool user_signal = sig == SIGUSR1 || sig == SIGUSR2;
    if (s.phase == P::kExitBarrier) {
      // Only the exit barrier is left: a terminating signal ends the wait.
      if (!user_signal) finish_now(exit_codes::kSignalBase + sig);
      return;
    }
    if (s.settling && !user_signal) {
      // The workers are stopped and only a failure's verdict is awaited: do not wait for it.
      s.cause.record_signal(sig);
      s.settling = false;
      say(A::kLogWarning,
          fmt::format("received {} while settling a failure; stopping", signal_name(sig)));
      return finish_now(exit_codes::kSignalBase + sig);
    }
    if (user_signal) return user_signal_received(sig);
    if (s.cause.signal != 0 && s.phase == P::kStopping) return with_signal(A::kKillNow, sig);
    stop_job(sig, e.text);
  }

  void user_signal_received(int sig) {
    say(A::kLogInfo, fmt::format("received {}; forwarding it to every worker", signal_name(sig)));
    with_signal(A::kForward, sig);
    if (sig == SIGUSR1 && !s.cause.is(StopKind::kPreempted)) {
      s.cause.record(StopKind::kPreempted);
      say(A::kLogWarning, fmt::format("SIGUSR1 is the preemption notice: when the workers stop, "
                                      "dlaunch exits with {} (requeue) and does not restart them",
                                      exit_codes::kPreempted));
    }
  }

  void stop_job(int sig, const std::string& by) {
    s.cause.record_signal(sig);
    if (by.empty()) {
      say(A::kLogWarning, fmt::format("received {}; forwarding it to every worker and stopping "
                                      "the job",
                                      signal_name(sig)));
    } else {
      say(A::kLogWarning, fmt::format("stop requested by {}; sending {} to every worker and "
                                      "stopping the job",
                                      by, signal_name(sig)));
    }
    switch (s.phase) {
      case P::kRendezvous:
        return finish(exit_codes::kSignalBase + sig);
      case P::kRunning:
      case P::kCapturing:
        // A healthy group stopped by a signal is this node leaving (Kubernetes deleting its
        // pod): the others are told before its workers die, so the failures that causes in
        // theirs are not charged. A hang being investigated is a failure already, and stays one.
        if (s.multi_node && s.phase == P::kRunning) act(A::kBeginLeaving);
        act(A::kStopRequested, 0, fmt::format("dlaunch received {}", signal_name(sig)));
        s.phase = P::kRunning;  // a capture in progress is abandoned
        return stop(sig);
      case P::kStopping:
        return with_signal(A::kForward, sig);
      case P::kExitBarrier:
      case P::kDone:
        return;
    }
  }
};

// Hangs, control requests, the exit barrier and the start of a generation; on() dispatches.
struct Stepper : SignalSteps {
  // The silent ranks here wait in a collective for a rank stuck on another node, whose agent
  // replaces it alone: they re-form with its replacement, so this node keeps them and watches
  // on. Should that node restart the job instead (its budget spent), its request comes as a
  // peer's restart. Without rank recovery here, or with the job stopping, as any hang.
  void hang_replaced_elsewhere(const Event& e) {
    if (s.phase != P::kCapturing) return;
    if (!s.rank_recovery || s.cause.kind != StopKind::kNone || s.cause.signal != 0 ||
        s.settling) {
      return hang_verdict(e);
    }
    s.phase = P::kRunning;
    say(A::kLogWarning, e.text + "; that node replaces it alone, and the ranks here wait for the "
                                 "re-formed group");
    act(A::kForgiveHang);
    if (s.hang_checks) act(A::kArmHangChecks);
  }

  void hang_verdict(const Event& e) {
    if (s.phase != P::kCapturing) return;
    // The peer that asked has told every node already.
    if (s.multi_node && !e.flag) act(A::kReportToPeers, 0, e.text);
    stop(SIGTERM);
  }

  void control_stop(const Event& e) {
    if (s.phase == P::kDone) return act(A::kAnswer, 409, "the job is already over");
    // After the answer is on its way: stopping may end the loop at once (no worker left, a
    // rendezvous round pending), and then the answer would never be written.
    Action later{A::kSignalLater};
    later.signal = SIGTERM;
    later.text = e.text;
    out.push_back(later);
    act(A::kAnswer, 200,
        fmt::format("stopping (as on SIGTERM; dlaunch exits {})",
                    exit_codes::kSignalBase + SIGTERM));
  }

  // `dlaunch restart` takes the path of a failure elsewhere: counted against --max_restarts,
  // refused when none is left.
  void control_restart(const Event& e) {
    if (!working()) {
      return act(A::kAnswer, 409,
                 fmt::format("not restarting: the workers are not running (phase {})",
                             agent_phase_name(s.phase)));
    }
    const int64_t used = s.restart_count();
    if (used >= s.max_restarts) {
      return act(A::kAnswer, 409,
                 fmt::format("not restarting: the restart budget is spent ({} of "
                             "--max_restarts {}); a restart would end the job",
                             used, s.max_restarts));
    }
    const std::string reason = "restart requested by " + e.text;
    say(A::kLogWarning,
        reason + "; restarting the worker group (counted against --max_restarts)");
    act(A::kStopRequested, 0, reason);
    s.cause.record(StopKind::kPeerRestart);
    if (s.multi_node) act(A::kReportToPeers, 0, reason);
    s.phase = P::kRunning;  // a capture in progress is abandoned
    stop(SIGTERM);
    act(A::kAnswer, 200,
        fmt::format("restarting the worker groups job-wide ({} of {} restarts)", used + 1,
                    s.max_restarts));
  }

  // A worker failed (or hung) in a healthy group. It is replaced alone when it can re-form with
  // the others in process; otherwise nothing happens here and the group takes the failure as
  // before (kWorkerFailed, kHangVerdict), whose stop writes the verdict `restart`.
  void rank_failed(const Event& e) {
    if (!s.rank_recovery || !e.flag) return;
    const std::string why_not = replacement_refused(e);
    if (!why_not.empty()) {
      say(A::kLogWarning, fmt::format("{}; not replaced alone although it announced "
                                      "rank_recovery: {}",
                                      e.text, why_not));
      return;
    }
    ++s.restarts_used;
    ++s.round_replacements;
    if (e.hung) s.phase = P::kRunning;  // the capture is over
    Action replace{A::kReplaceRank};
    replace.count = e.count;
    replace.code = static_cast<int>(s.restart_count());
    replace.flag = e.hung;
    replace.text = fmt::format("{}; replaced in process, the other workers go on; restart {} of "
                               "{}",
                               e.text, s.restart_count(), s.max_restarts);
    out.push_back(replace);
    if (e.hung && s.hang_checks) act(A::kArmHangChecks);
  }

  // Why a failed worker that announced rank_recovery is not replaced alone; "" when it is.
  std::string replacement_refused(const Event& e) const {
    if (s.phase != P::kRunning && !(e.hung && s.phase == P::kCapturing)) {
      return fmt::format("the agent is not running the workers (phase {})",
                         agent_phase_name(s.phase));
    }
    if (s.cause.kind != StopKind::kNone || s.cause.signal != 0 || s.settling) {
      return "the job is being stopped";
    }
    if (s.restart_count() >= s.max_restarts) {
      return fmt::format("the restart budget is spent ({} of --max_restarts {}; a replacement "
                         "counts as one restart)",
                         s.restart_count(), s.max_restarts);
    }
    if (e.in_flight) {
      return "an earlier replacement on this node has not beaten yet (the group may be unable "
             "to re-form)";
    }
    return "";
  }

  void barrier_done(const Event& e) {
    if (e.generation != s.generation || s.phase != P::kExitBarrier) return;
    s.passed_exit_barrier = e.flag;
    finish_now(e.flag ? exit_codes::kSuccess : exit_codes::kWorkersFailed);
  }

  void forming(const Event& e) {
    switch (e.kind) {
      case E::kStart:
        return begin_generation();
      case E::kRoundFormed:
        return round_formed(e);
      case E::kRoundFailed:
        return finish(e.code);
      case E::kJobFinishedElsewhere:
        return finish_now(exit_codes::kSuccess);
      case E::kAttemptFailed:
        return finish(exit_codes::kWorkersFailed);
      case E::kWorkersStarting:
        s.phase = P::kRunning;
        return;
      default:
        return;
    }
  }

  void spawning(const Event& e) {
    switch (e.kind) {
      case E::kWorkersSpawned:
        if (s.hang_checks) act(A::kArmHangChecks);
        return;
      case E::kSpawnFailed:
        if (e.flag) s.cause.record(StopKind::kUsage);
        return stop(SIGTERM);
      case E::kNothingToInvestigate:
        return stop(SIGTERM);
      default:
        return;
    }
  }

  void on(const Event& e) {
    if (s.keeping_workers && s.phase == P::kRendezvous && while_keeping(e)) return;
    switch (e.kind) {
      // A generation begins: these come only while the round forms (the agent leaves that phase
      // only by a round formed or by ending).
      case E::kStart:
      case E::kRoundFormed:
      case E::kRoundFailed:
      case E::kJobFinishedElsewhere:
      case E::kAttemptFailed:
      case E::kWorkersStarting:
        if (s.phase == P::kRendezvous) forming(e);
        return;
      // The workers are being spawned, or a peer's request found none of them silent.
      case E::kWorkersSpawned:
      case E::kSpawnFailed:
      case E::kNothingToInvestigate:
        if (s.phase == P::kRunning) spawning(e);
        return;
      case E::kExecFailed:
        // The program was found but could not be executed: a usage problem, no restart helps.
        // A group that was not final yet runs (or is being investigated).
        s.cause.record(StopKind::kUsage);
        if (!e.flag) {
          if (working()) stop(SIGTERM);
          return;
        }
        if (s.phase == P::kStopping && e.all_exited) group_down(e.group);
        return;
      case E::kWorkerFailed:
        if (!working()) return;
        if (s.multi_node) act(A::kReportToPeers, 0, e.text);
        return stop(SIGTERM);
      case E::kWorkerExited:
        return worker_exited(e);
      case E::kGroupDown:
        return group_down(e.group);
      case E::kPeerEvent:
        return peer_event(e);
      case E::kStoreLost:
        return store_lost(e);
      case E::kFailureVerdict:
        return verdict(e);
      case E::kSignal:
        return signal(e);
      case E::kCaptureStarted:
        if (working()) s.phase = P::kCapturing;
        return;
      case E::kHangVerdict:
        return hang_verdict(e);
      case E::kControlStop:
        return control_stop(e);
      case E::kControlRestart:
        return control_restart(e);
      case E::kBarrierDone:
        return barrier_done(e);
      case E::kRankFailed:
        return rank_failed(e);
      case E::kHangReplacedElsewhere:
        return hang_replaced_elsewhere(e);
    }
  }
};

}  // namespace

StepResult step(AgentState state, const Event& event) {
  Stepper st;
  st.s = std::move(state);
  st.on(event);
  return {std::move(st.s), std::move(st.out)};
}

const char* event_name(Event::Kind k) {
  switch (k) {
    case E::kStart: return "start";
    case E::kRoundFormed: return "round_formed";
    case E::kRoundFailed: return "round_failed";
    case E::kJobFinishedElsewhere: return "job_finished_elsewhere";
    case E::kAttemptFailed: return "attempt_failed";
    case E::kWorkersStarting: return "workers_starting";
    case E::kWorkersSpawned: return "workers_spawned";
    case E::kSpawnFailed: return "spawn_failed";
    case E::kExecFailed: return "exec_failed";
    case E::kWorkerFailed: return "worker_failed";
    case E::kWorkerExited: return "worker_exited";
    case E::kGroupDown: return "group_down";
    case E::kPeerEvent: return "peer_event";
    case E::kStoreLost: return "store_lost";
    case E::kFailureVerdict: return "failure_verdict";
    case E::kSignal: return "signal";
    case E::kCaptureStarted: return "capture_started";
    case E::kHangVerdict: return "hang_verdict";
    case E::kNothingToInvestigate: return "nothing_to_investigate";
    case E::kControlStop: return "control_stop";
    case E::kControlRestart: return "control_restart";
    case E::kBarrierDone: return "barrier_done";
    case E::kRankFailed: return "rank_failed";
    case E::kHangReplacedElsewhere: return "hang_replaced_elsewhere";
  }
  return "?";
}

const char* action_name(Action::Kind k) {
  switch (k) {
    case A::kBeginGeneration: return "begin_generation";
    case A::kStartWorkers: return "start_workers";
    case A::kArmHangChecks: return "arm_hang_checks";
    case A::kStopRequested: return "stop_requested";
    case A::kStopGroup: return "stop_group";
    case A::kStopLeftovers: return "stop_leftovers";
    case A::kKillNow: return "kill_now";
    case A::kForward: return "forward";
    case A::kBeginLeaving: return "begin_leaving";
    case A::kReportToPeers: return "report_to_peers";
    case A::kInvestigateForPeer: return "investigate_for_peer";
    case A::kSettle: return "settle";
    case A::kCollectGroup: return "collect_group";
    case A::kSayWhyFinished: return "say_why_finished";
    case A::kReportFailure: return "report_failure";
    case A::kRecordRestart: return "record_restart";
    case A::kRecordPeerFailure: return "record_peer_failure";
    case A::kCancelTimers: return "cancel_timers";
    case A::kStartExitBarrier: return "start_exit_barrier";
    case A::kFinishNow: return "finish_now";
    case A::kPauseHangChecks: return "pause_hang_checks";
    case A::kResumeHangChecks: return "resume_hang_checks";
    case A::kStopSelf: return "stop_self";
    case A::kReapOrphans: return "reap_orphans";
    case A::kSignalLater: return "signal_later";
    case A::kTimeline: return "timeline";
    case A::kLogInfo: return "log_info";
    case A::kLogWarning: return "log_warning";
    case A::kLogError: return "log_error";
    case A::kAnswer: return "answer";
    case A::kReplaceRank: return "replace_rank";
    case A::kAnnounceRestart: return "announce_restart";
    case A::kForgiveHang: return "forgive_hang";
    case A::kRendezvousKeepingWorkers: return "rendezvous_keeping_workers";
    case A::kShrink: return "shrink";
  }
  return "?";
}

}  // namespace dlaunch
