// The agent's whole lifecycle (launcher/agent/agent_step.h) as tables: every event in every
// phase, then the paths that cross several steps (a failure settled and restarted, a success
// at the exit barrier, signals, control requests), all without processes, timers or a loop.
#include "launcher/agent/agent_step.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "launcher/agent/exit_codes.h"

namespace dlaunch {
namespace {

using A = Action::Kind;
using E = Event::Kind;
using P = AgentPhase;

constexpr P kPhases[] = {P::kRendezvous, P::kRunning,     P::kCapturing,
                         P::kStopping,   P::kExitBarrier, P::kDone};
constexpr char kPhaseLetters[] = "RUCSBD";  // the order of kPhases

// A job of several nodes in generation 0, restart budget 3 (none used), hang checks on, with an
// exit barrier due at a success.
AgentState job_in(P phase) {
  AgentState s;
  s.phase = phase;
  s.generation = 0;
  s.round_restarts = 0;
  s.max_restarts = 3;
  s.multi_node = true;
  s.hang_checks = true;
  s.exit_barrier_due = true;
  return s;
}

// One plain event of each kind, as the parts post it.
Event plain(E kind) {
  Event e{kind};
  switch (kind) {
    case E::kRoundFormed:
      e.flag = true;
      break;
    case E::kRoundFailed:
      e.code = exit_codes::kWorkersFailed;
      break;
    case E::kWorkerFailed:
      e.text = "rank 0 on a failed: exit code 1";
      break;
    case E::kWorkerExited:
      e.group = GroupState::kSucceeded;
      e.all_exited = true;
      e.count = 2;
      break;
    case E::kExecFailed:
    case E::kGroupDown:
      e.group = GroupState::kFailed;
      break;
    case E::kPeerEvent:
      e.peer = Event::Peer::kRestartRequested;
      e.text = "rank 3 on b failed";
      break;
    case E::kStoreLost:
      e.text = "the job's store is gone";
      break;
    case E::kSignal:
      e.signal = SIGTERM;
      break;
    case E::kHangVerdict:
      e.text = "rank 1 on a hung";
      break;
    case E::kControlStop:
    case E::kControlRestart:
      e.text = "alice";
      break;
    case E::kBarrierDone:
      e.flag = true;
      break;
    case E::kRankFailed:
      e.count = 1;
      e.flag = true;  // it announced rank_recovery
      e.text = "rank 1 (local 1, pid 42) failed: exit code 1";
      break;
    default:
      break;
  }
  return e;
}

// "S stop_requested stop_group": the next phase's letter, then the actions' names in order.
std::string outcome(const StepResult& r) {
  std::string out(1, kPhaseLetters[static_cast<int>(r.state.phase)]);
  for (const Action& a : r.actions) out += std::string(" ") + action_name(a.kind);
  return out;
}

std::vector<std::string> names(const std::vector<Action>& actions) {
  std::vector<std::string> out;
  for (const Action& a : actions) out.push_back(action_name(a.kind));
  return out;
}

const Action* find(const std::vector<Action>& actions, A kind) {
  for (const Action& a : actions) {
    if (a.kind == kind) return &a;
  }
  return nullptr;
}

struct Row {
  E event;
  // What the plain event does in each phase, in kPhases' order.
  std::vector<std::string> in_phase;
};

// Read down a column for what the agent does in one phase, along a row for what one event does
// wherever it arrives. Events that cannot arrive in a phase do nothing there.
const std::vector<Row> kTable = {
    {E::kStart, {"R begin_generation", "U", "C", "S", "B", "D"}},
    {E::kRoundFormed, {"R start_workers", "U", "C", "S", "B", "D"}},
    {E::kRoundFailed, {"D cancel_timers finish_now", "U", "C", "S", "B", "D"}},
    {E::kJobFinishedElsewhere, {"D finish_now", "U", "C", "S", "B", "D"}},
    {E::kAttemptFailed, {"D cancel_timers finish_now", "U", "C", "S", "B", "D"}},
    {E::kWorkersStarting, {"U", "U", "C", "S", "B", "D"}},
    {E::kWorkersSpawned, {"R", "U arm_hang_checks", "C", "S", "B", "D"}},
    {E::kSpawnFailed, {"R", "S stop_group", "C", "S", "B", "D"}},
    {E::kExecFailed, {"R", "S stop_group", "S stop_group", "S", "B", "D"}},
    {E::kWorkerFailed,
     {"R", "S report_to_peers stop_group", "S report_to_peers stop_group", "S", "B", "D"}},
    {E::kWorkerExited,
     {"R", "S log_info stop_leftovers", "C",
      "B collect_group say_why_finished cancel_timers start_exit_barrier", "B", "D"}},
    {E::kGroupDown, {"R", "U", "C", "S collect_group settle", "B", "D"}},
    {E::kPeerEvent,
     {"R", "U log_warning stop_requested investigate_for_peer", "C log_warning stop_requested", "S",
      "B settle", "D"}},
    {E::kStoreLost,
     {"R", "S stop_requested stop_group", "S stop_requested stop_group", "S",
      "D log_error finish_now", "D"}},
    {E::kFailureVerdict, {"R", "U", "C", "S", "B", "D"}},
    {E::kSignal,
     {"D timeline log_warning cancel_timers finish_now",
      "S timeline log_warning begin_leaving stop_requested stop_group",
      "S timeline log_warning stop_requested stop_group", "S timeline log_warning forward",
      "D timeline finish_now", "D"}},
    {E::kCaptureStarted, {"R", "C", "C", "S", "B", "D"}},
    {E::kHangVerdict, {"R", "U", "S report_to_peers stop_group", "S", "B", "D"}},
    {E::kNothingToInvestigate, {"R", "S stop_group", "C", "S", "B", "D"}},
    {E::kControlStop,
     {"R signal_later answer", "U signal_later answer", "C signal_later answer",
      "S signal_later answer", "B signal_later answer", "D answer"}},
    {E::kControlRestart,
     {"R answer", "S log_warning stop_requested report_to_peers stop_group answer",
      "S log_warning stop_requested report_to_peers stop_group answer", "S answer", "B answer",
      "D answer"}},
    {E::kBarrierDone, {"R", "U", "C", "S", "D finish_now", "D"}},
    // Without --restart_scope rank (job_in's default) nothing is ever replaced alone.
    {E::kRankFailed, {"R", "U", "C", "S", "B", "D"}},
    // Without rank recovery here: a hang like any other.
    {E::kHangReplacedElsewhere, {"R", "U", "S report_to_peers stop_group", "S", "B", "D"}},
};

TEST(AgentStepTable, EveryEventInEveryPhase) {
  std::vector<bool> seen(static_cast<size_t>(E::kHangReplacedElsewhere) + 1, false);
  for (const Row& row : kTable) {
    ASSERT_EQ(row.in_phase.size(), std::size(kPhases)) << event_name(row.event);
    seen[static_cast<size_t>(row.event)] = true;
    for (size_t i = 0; i < std::size(kPhases); ++i) {
      StepResult r = step(job_in(kPhases[i]), plain(row.event));
      EXPECT_EQ(outcome(r), row.in_phase[i])
          << event_name(row.event) << " in " << agent_phase_name(kPhases[i]);
    }
  }
  for (size_t k = 0; k < seen.size(); ++k) {
    EXPECT_TRUE(seen[k]) << "no row for " << event_name(static_cast<E>(k));
  }
}

// A run: each event stepped from the state the previous one left.
struct Steps {
  AgentState s;
  std::vector<Action> last;
  explicit Steps(AgentState start) : s(std::move(start)) {}
  Steps& on(const Event& e) {
    StepResult r = step(s, e);
    s = std::move(r.state);
    last = std::move(r.actions);
    return *this;
  }
  Steps& on(E kind) { return on(Event{kind}); }
};

Event group_down(GroupState g) {
  Event e{E::kGroupDown};
  e.group = g;
  return e;
}

Event verdict(int64_t gen, Event::Verdict v, std::string reason = "") {
  Event e{E::kFailureVerdict};
  e.generation = gen;
  e.verdict = v;
  e.text = std::move(reason);
  return e;
}

Event signal_event(int sig) {
  Event e{E::kSignal};
  e.signal = sig;
  return e;
}

Event peer(Event::Peer p, std::string reason) {
  Event e{E::kPeerEvent};
  e.peer = p;
  e.text = std::move(reason);
  return e;
}

Event round(int64_t restart_count, bool barrier) {
  Event e{E::kRoundFormed};
  e.count = restart_count;
  e.flag = barrier;
  return e;
}

TEST(AgentStepPaths, SingleNodeFailureRestartsUntilTheBudgetIsSpent) {
  AgentState start;
  start.max_restarts = 1;
  Steps run(start);
  run.on(E::kStart).on(round(0, false)).on(E::kWorkersStarting).on(E::kWorkersSpawned);
  EXPECT_EQ(run.s.generation, 0);
  EXPECT_EQ(run.s.phase, P::kRunning);
  run.on(plain(E::kWorkerFailed));
  EXPECT_EQ(names(run.last), (std::vector<std::string>{"stop_group"}));  // nobody to tell
  run.on(group_down(GroupState::kFailed));
  EXPECT_EQ(names(run.last),
            (std::vector<std::string>{"collect_group", "record_restart", "begin_generation"}));
  EXPECT_TRUE(run.last[1].flag);  // counted
  EXPECT_EQ(run.s.restarts_used, 1);
  EXPECT_EQ(run.s.phase, P::kRendezvous);
  run.on(round(1, false)).on(E::kWorkersStarting).on(plain(E::kWorkerFailed));
  run.on(group_down(GroupState::kFailed));
  EXPECT_EQ(names(run.last),
            (std::vector<std::string>{"collect_group", "say_why_finished", "report_failure",
                                      "cancel_timers", "finish_now"}));
  EXPECT_EQ(run.s.phase, P::kDone);
  EXPECT_EQ(run.s.exit_code, exit_codes::kWorkersFailed);
  EXPECT_EQ(run.s.generation, 1);
}

TEST(AgentStepPaths, SeveralNodesSettleAFailureBeforeSpendingTheBudget) {
  Steps run(job_in(P::kStopping));
  run.on(group_down(GroupState::kFailed));
  EXPECT_TRUE(run.s.settling);
  EXPECT_EQ(run.s.phase, P::kStopping);
  // A verdict for another generation is stale.
  run.on(verdict(7, Event::Verdict::kCounted));
  EXPECT_TRUE(run.last.empty());
  run.on(verdict(0, Event::Verdict::kNodeLost, "node b lost"));
  EXPECT_FALSE(run.s.settling);
  EXPECT_EQ(names(run.last), (std::vector<std::string>{"record_restart", "begin_generation"}));
  EXPECT_FALSE(run.last[0].flag);  // free
  EXPECT_EQ(run.last[0].text, "node b lost");
  EXPECT_EQ(run.s.restarts_used, 0);

  Steps counted(job_in(P::kStopping));
  counted.on(group_down(GroupState::kFailed)).on(verdict(0, Event::Verdict::kCounted));
  EXPECT_EQ(counted.s.restarts_used, 1);
  EXPECT_EQ(counted.s.phase, P::kRendezvous);

  Steps lost(job_in(P::kStopping));
  lost.on(group_down(GroupState::kFailed))
      .on(verdict(0, Event::Verdict::kStoreLost, "the store is gone"));
  EXPECT_EQ(lost.s.phase, P::kDone);
  EXPECT_EQ(lost.s.exit_code, exit_codes::kWorkersFailed);
  EXPECT_EQ(lost.s.store_lost, "the store is gone");
}

TEST(AgentStepPaths, APreemptionNoticeWhileSettlingExits75) {
  Steps run(job_in(P::kStopping));
  run.on(group_down(GroupState::kFailed)).on(signal_event(SIGUSR1));
  EXPECT_TRUE(run.s.cause.is(StopKind::kPreempted));
  run.on(verdict(0, Event::Verdict::kNodeLost, "node b lost"));
  EXPECT_EQ(run.s.phase, P::kDone);
  EXPECT_EQ(run.s.exit_code, exit_codes::kPreempted);
}

TEST(AgentStepPaths, AStopSignalWhileSettlingEndsAtOnce) {
  Steps run(job_in(P::kStopping));
  run.on(group_down(GroupState::kFailed)).on(signal_event(SIGTERM));
  EXPECT_EQ(run.s.phase, P::kDone);
  EXPECT_EQ(run.s.exit_code, exit_codes::kSignalBase + SIGTERM);
  EXPECT_FALSE(run.s.settling);
  // The verdict that comes later is dropped.
  run.on(verdict(0, Event::Verdict::kCounted));
  EXPECT_TRUE(run.last.empty());
}

TEST(AgentStepPaths, SuccessWaitsAtTheExitBarrierOnSeveralNodes) {
  Steps run(job_in(P::kRunning));
  run.on(plain(E::kWorkerExited));
  EXPECT_EQ(run.s.phase, P::kStopping);
  run.on(group_down(GroupState::kSucceeded));
  EXPECT_EQ(run.s.phase, P::kExitBarrier);
  Event stale{E::kBarrierDone};
  stale.generation = 5;
  stale.flag = true;
  run.on(stale);
  EXPECT_EQ(run.s.phase, P::kExitBarrier);
  Event passed{E::kBarrierDone};
  passed.flag = true;
  run.on(passed);
  EXPECT_EQ(run.s.phase, P::kDone);
  EXPECT_EQ(run.s.exit_code, exit_codes::kSuccess);
  EXPECT_TRUE(run.s.passed_exit_barrier);

  // A single node, or a round without a store, has no barrier.
  AgentState single = job_in(P::kStopping);
  single.multi_node = false;
  Steps alone(single);
  alone.on(group_down(GroupState::kSucceeded));
  EXPECT_EQ(alone.s.phase, P::kDone);
  EXPECT_EQ(alone.s.exit_code, exit_codes::kSuccess);
}

TEST(AgentStepPaths, AFailureElsewhereAfterSuccessRejoinsWhileTheBudgetLasts) {
  Steps run(job_in(P::kExitBarrier));
  run.on(peer(Event::Peer::kRestartRequested, "rank 3 on b failed"));
  EXPECT_TRUE(run.s.settling_after_success);
  run.on(verdict(0, Event::Verdict::kCounted));
  EXPECT_EQ(names(run.last),
            (std::vector<std::string>{"log_warning", "record_peer_failure", "begin_generation"}));
  EXPECT_EQ(run.last[1].text, "rank 3 on b failed");
  EXPECT_EQ(run.s.restarts_used, 1);
  EXPECT_EQ(run.s.phase, P::kRendezvous);

  AgentState spent = job_in(P::kExitBarrier);
  spent.round_restarts = 3;
  Steps over(spent);
  over.on(peer(Event::Peer::kRestartRequested, "rank 3 on b failed"))
      .on(verdict(0, Event::Verdict::kCounted));
  EXPECT_EQ(over.s.phase, P::kDone);
  EXPECT_EQ(over.s.exit_code, exit_codes::kWorkersFailed);

  Steps lost(job_in(P::kExitBarrier));
  lost.on(peer(Event::Peer::kRestartRequested, "x"))
      .on(verdict(0, Event::Verdict::kNodeLost, "b lost"));
  EXPECT_EQ(lost.s.restarts_used, 0);
  EXPECT_EQ(lost.s.phase, P::kRendezvous);

  Steps closed(job_in(P::kExitBarrier));
  closed.on(peer(Event::Peer::kShutdownRequested, "b closed it"));
  EXPECT_EQ(closed.s.exit_code, exit_codes::kWorkersFailed);
  EXPECT_EQ(closed.s.phase, P::kDone);
}

TEST(AgentStepPaths, AMembershipChangeRejoinsForFreeAndIsSpentByTheNextRound) {
  Steps run(job_in(P::kRunning));
  run.on(peer(Event::Peer::kMembershipChanged, "node c joined"));
  EXPECT_EQ(names(run.last),
            (std::vector<std::string>{"log_warning", "stop_requested", "stop_group"}));
  EXPECT_EQ(run.last[1].text, "membership changed: node c joined");
  run.on(group_down(GroupState::kStopped));
  EXPECT_EQ(names(run.last), (std::vector<std::string>{"collect_group", "begin_generation"}));
  EXPECT_EQ(run.s.restarts_used, 0);
  EXPECT_TRUE(run.s.cause.is(StopKind::kMembershipChange));
  run.on(round(0, true));
  EXPECT_TRUE(run.s.cause.is(StopKind::kNone));
  EXPECT_EQ(run.s.generation, 1);
}

TEST(AgentStepPaths, TheStoreLostEndsTheJobWithItsSentence) {
  Steps run(job_in(P::kRunning));
  Event lost = plain(E::kStoreLost);
  run.on(lost);
  EXPECT_EQ(run.s.store_lost, lost.text);
  run.on(lost);  // said once
  EXPECT_TRUE(run.last.empty());
  run.on(group_down(GroupState::kStopped));
  const Action* why = find(run.last, A::kSayWhyFinished);
  ASSERT_NE(why, nullptr);
  EXPECT_EQ(static_cast<StopKind>(why->count), StopKind::kStoreLost);
  EXPECT_EQ(run.s.exit_code, exit_codes::kWorkersFailed);
}

TEST(AgentStepPaths, SignalsStopOnceThenKill) {
  Steps run(job_in(P::kRunning));
  run.on(signal_event(SIGINT));
  EXPECT_EQ(run.s.phase, P::kStopping);
  ASSERT_NE(find(run.last, A::kStopGroup), nullptr);
  EXPECT_EQ(find(run.last, A::kStopGroup)->signal, SIGINT);
  run.on(signal_event(SIGTERM));
  EXPECT_EQ(names(run.last), (std::vector<std::string>{"timeline", "kill_now"}));
  EXPECT_EQ(run.s.cause.signal, SIGINT);  // the first one is the exit code
  run.on(group_down(GroupState::kStopped));
  EXPECT_EQ(run.s.exit_code, exit_codes::kSignalBase + SIGINT);

  // `dlaunch stop` names who asked and has no timeline entry of its own here.
  Event by = signal_event(SIGTERM);
  by.text = "alice";
  Steps asked(job_in(P::kRunning));
  asked.on(by);
  EXPECT_EQ(asked.last[0].kind, A::kLogWarning);
  EXPECT_NE(asked.last[0].text.find("stop requested by alice"), std::string::npos);
}

TEST(AgentStepPaths, UserAndJobControlSignalsDoNotStopTheJob) {
  Steps run(job_in(P::kRunning));
  run.on(signal_event(SIGUSR1));
  EXPECT_EQ(run.s.phase, P::kRunning);
  EXPECT_TRUE(run.s.cause.is(StopKind::kPreempted));
  EXPECT_NE(find(run.last, A::kForward), nullptr);
  run.on(signal_event(SIGUSR2));
  EXPECT_EQ(run.s.phase, P::kRunning);
  run.on(signal_event(SIGTSTP));
  EXPECT_EQ(names(run.last),
            (std::vector<std::string>{"log_info", "pause_hang_checks", "forward", "stop_self"}));
  run.on(signal_event(SIGCONT));
  EXPECT_EQ(names(run.last),
            (std::vector<std::string>{"resume_hang_checks", "forward", "log_info"}));
  run.on(signal_event(SIGCHLD));
  EXPECT_EQ(names(run.last), (std::vector<std::string>{"reap_orphans"}));
  // A preempted group that exits 0 still exits 75.
  run.on(plain(E::kWorkerExited)).on(group_down(GroupState::kSucceeded));
  EXPECT_EQ(run.s.exit_code, exit_codes::kPreempted);
}

TEST(AgentStepPaths, ControlRestartIsCountedAndRefusedWhenTheBudgetIsSpent) {
  Steps run(job_in(P::kCapturing));
  run.on(plain(E::kControlRestart));
  const Action* answer = find(run.last, A::kAnswer);
  ASSERT_NE(answer, nullptr);
  EXPECT_EQ(answer->code, 200);
  EXPECT_EQ(answer->text, "restarting the worker groups job-wide (1 of 3 restarts)");
  EXPECT_TRUE(run.s.cause.is(StopKind::kPeerRestart));

  AgentState spent = job_in(P::kRunning);
  spent.round_restarts = 3;
  Steps refused(spent);
  refused.on(plain(E::kControlRestart));
  EXPECT_EQ(names(refused.last), (std::vector<std::string>{"answer"}));
  EXPECT_EQ(refused.last[0].code, 409);
  EXPECT_EQ(refused.s.phase, P::kRunning);

  Steps stop(job_in(P::kDone));
  stop.on(plain(E::kControlStop));
  EXPECT_EQ(stop.last[0].code, 409);
}

TEST(AgentStepPaths, APeersRestartRequestReadsSilentWorkersFirst) {
  Steps run(job_in(P::kRunning));
  run.on(peer(Event::Peer::kRestartRequested, "rank 3 on b hung"));
  EXPECT_EQ(run.s.phase, P::kRunning);
  ASSERT_NE(find(run.last, A::kInvestigateForPeer), nullptr);
  run.on(E::kCaptureStarted);
  EXPECT_EQ(run.s.phase, P::kCapturing);
  Event judged{E::kHangVerdict};
  judged.flag = true;  // asked by the peer: it told everyone already
  run.on(judged);
  EXPECT_EQ(names(run.last), (std::vector<std::string>{"stop_group"}));
  EXPECT_EQ(run.s.phase, P::kStopping);
}

TEST(AgentStepPaths, AnUnusableProgramExits2WithoutRestarting) {
  Steps run(job_in(P::kRunning));
  Event failed{E::kSpawnFailed};
  failed.flag = true;
  run.on(failed).on(group_down(GroupState::kFailed));
  EXPECT_EQ(run.s.exit_code, exit_codes::kUsage);
  EXPECT_EQ(run.s.restarts_used, 0);
}

TEST(AgentStepPaths, RoundsThatFailEndTheJob) {
  Steps run(AgentState{});
  run.on(E::kStart);
  Event mismatch{E::kRoundFailed};
  mismatch.code = exit_codes::kNodeMismatch;
  run.on(mismatch);
  EXPECT_EQ(run.s.exit_code, exit_codes::kNodeMismatch);

  Steps spare(AgentState{});
  spare.on(E::kStart).on(E::kJobFinishedElsewhere);
  EXPECT_EQ(spare.s.exit_code, exit_codes::kSuccess);
  EXPECT_EQ(spare.s.phase, P::kDone);
}

// ---- rank recovery (--restart_scope rank) ---------------------------------------------------

AgentState recovering_job_in(P phase) {
  AgentState s = job_in(phase);
  s.rank_recovery = true;
  return s;
}

Event rank_failed(bool announced, bool in_flight = false, bool hung = false) {
  Event e = plain(E::kRankFailed);
  e.flag = announced;
  e.in_flight = in_flight;
  e.hung = hung;
  return e;
}

struct RecoveryRow {
  const char* what;
  AgentState state;
  Event event;
  std::string outcome;
};

// When a failed worker is replaced alone, and each reason it is not (the group then takes the
// failure as before: kWorkerFailed or kHangVerdict follow, and their stop says `restart`).
TEST(AgentStepRankRecovery, ReplaceOrFallBack) {
  AgentState spent = recovering_job_in(P::kRunning);
  spent.round_restarts = 3;  // of --max_restarts 3
  AgentState preempted = recovering_job_in(P::kRunning);
  preempted.cause.record(StopKind::kPreempted);
  AgentState signalled = recovering_job_in(P::kStopping);
  signalled.cause.record_signal(SIGTERM);
  AgentState peer_restart = recovering_job_in(P::kRunning);
  peer_restart.cause.record(StopKind::kPeerRestart);
  AgentState group_scope = job_in(P::kRunning);  // --restart_scope group
  const std::vector<RecoveryRow> rows = {
      {"announced, budget left", recovering_job_in(P::kRunning), rank_failed(true),
       "U replace_rank"},
      {"hung and announced: the capture ends, the checks go on",
       recovering_job_in(P::kCapturing), rank_failed(true, false, true),
       "U replace_rank arm_hang_checks"},
      {"not announced", recovering_job_in(P::kRunning), rank_failed(false), "U"},
      {"budget spent", spent, rank_failed(true), "U log_warning"},
      {"an earlier replacement in flight", recovering_job_in(P::kRunning),
       rank_failed(true, true), "U log_warning"},
      {"preemption notice", preempted, rank_failed(true), "U log_warning"},
      {"another node's restart", peer_restart, rank_failed(true), "U log_warning"},
      {"stopping on a signal", signalled, rank_failed(true), "S log_warning"},
      {"an exit while capturing a hang", recovering_job_in(P::kCapturing), rank_failed(true),
       "C log_warning"},
      {"--restart_scope group", group_scope, rank_failed(true), "U"},
  };
  for (const RecoveryRow& row : rows) {
    EXPECT_EQ(outcome(step(row.state, row.event)), row.outcome) << row.what;
  }
}

TEST(AgentStepRankRecovery, AReplacementSpendsOneRestartOfTheRound) {
  AgentState start;
  start.max_restarts = 2;
  start.rank_recovery = true;
  Steps run(start);
  run.on(E::kStart).on(round(0, false)).on(E::kWorkersStarting).on(E::kWorkersSpawned);
  run.on(rank_failed(true));
  ASSERT_EQ(names(run.last), (std::vector<std::string>{"replace_rank"}));
  EXPECT_EQ(run.last[0].count, 1);  // the local rank
  EXPECT_EQ(run.last[0].code, 1);   // the first restart
  EXPECT_FALSE(run.last[0].flag);   // not hung: nothing to kill
  EXPECT_EQ(run.last[0].text,
            "rank 1 (local 1, pid 42) failed: exit code 1; replaced in process, the other "
            "workers go on; restart 1 of 2");
  EXPECT_EQ(run.s.phase, P::kRunning);
  EXPECT_EQ(run.s.restart_count(), 1);
  EXPECT_EQ(run.s.restarts_used, 1);
  run.on(rank_failed(true));
  EXPECT_EQ(run.last[0].code, 2);
  EXPECT_EQ(run.s.restart_count(), 2);
  // The budget is spent: the next failure is the group's, which ends the job with the verdict
  // `restart` said before the stop.
  run.on(rank_failed(true));
  EXPECT_EQ(names(run.last), (std::vector<std::string>{"log_warning"}));
  EXPECT_NE(run.last[0].text.find("the restart budget is spent (2 of --max_restarts 2"),
            std::string::npos)
      << run.last[0].text;
  run.on(plain(E::kWorkerFailed));
  EXPECT_EQ(names(run.last), (std::vector<std::string>{"announce_restart", "stop_group"}));
  run.on(group_down(GroupState::kFailed));
  EXPECT_EQ(run.s.exit_code, exit_codes::kWorkersFailed);
}

TEST(AgentStepRankRecovery, TheNextRoundCountsItsOwnReplacements) {
  AgentState start;
  start.max_restarts = 3;
  start.rank_recovery = true;
  Steps run(start);
  run.on(E::kStart).on(round(0, false)).on(E::kWorkersStarting).on(E::kWorkersSpawned);
  run.on(rank_failed(true)).on(plain(E::kWorkerFailed)).on(group_down(GroupState::kFailed));
  // The replacement and the group's restart: two of three.
  EXPECT_EQ(run.s.restarts_used, 2);
  const Action* restart = find(run.last, A::kRecordRestart);
  ASSERT_NE(restart, nullptr);
  EXPECT_EQ(restart->count, 1);  // it started from one restart spent
  run.on(round(run.s.restarts_used, false));
  EXPECT_EQ(run.s.round_replacements, 0);
  EXPECT_EQ(run.s.restart_count(), 2);
}

TEST(AgentStepRankRecovery, EveryStopSaysRestartFirstExceptWithoutAStore) {
  EXPECT_EQ(outcome(step(recovering_job_in(P::kRunning), plain(E::kWorkerFailed))),
            "S report_to_peers announce_restart stop_group");
  EXPECT_EQ(outcome(step(recovering_job_in(P::kCapturing), plain(E::kHangVerdict))),
            "S report_to_peers announce_restart stop_group");
  EXPECT_EQ(outcome(step(recovering_job_in(P::kRunning), signal_event(SIGTERM))),
            "S timeline log_warning begin_leaving stop_requested announce_restart stop_group");
  EXPECT_EQ(outcome(step(recovering_job_in(P::kRunning), plain(E::kStoreLost))),
            "S stop_requested stop_group");
  // --restart_scope group: as before.
  EXPECT_EQ(outcome(step(job_in(P::kRunning), plain(E::kWorkerFailed))),
            "S report_to_peers stop_group");
}

// A hang whose stuck rank is on another node that replaces it alone: the silent ranks here are
// kept (they re-form with the replacement) and watched on; with the job stopping, or without
// rank recovery here, it is a hang like any other.
TEST(AgentStepRankRecovery, AHangReplacedOnAnotherNodeKeepsTheRanksHere) {
  Event e = plain(E::kHangReplacedElsewhere);
  e.text = "the ranks on a hung waiting for rank 3 on node 1";
  StepResult kept = step(recovering_job_in(P::kCapturing), e);
  EXPECT_EQ(outcome(kept), "U log_warning forgive_hang arm_hang_checks");
  EXPECT_EQ(kept.state.restarts_used, 0);  // the other node spends its own budget
  AgentState stopping = recovering_job_in(P::kCapturing);
  stopping.cause.record(StopKind::kPeerRestart);
  EXPECT_EQ(outcome(step(stopping, e)), "S report_to_peers announce_restart stop_group");
  EXPECT_EQ(outcome(step(recovering_job_in(P::kRunning), e)), "U");
}


// ---- in-process shrink (a node lost, --restart_scope rank) ------------------------------------

Event node_lost(bool announced, bool in_flight = false) {
  Event e = peer(Event::Peer::kMembershipChanged, "node b (node rank 2) lost (no keep-alive for 3 s)");
  e.flag = true;  // a node of the round died
  e.announced = announced;
  e.in_flight = in_flight;
  return e;
}

Event kept_round(int64_t restart_count, bool every_node_kept) {
  Event e = round(restart_count, true);
  e.every_node_kept = every_node_kept;
  return e;
}

// When a membership change keeps the workers here for a shrink in place, and each reason it
// does not (today's restart, whose stop says `restart` to the workers that opted in).
TEST(AgentStepShrink, KeepTheWorkersOrRestartAsBefore) {
  AgentState preempted = recovering_job_in(P::kRunning);
  preempted.cause.record(StopKind::kPreempted);
  Event joining = node_lost(true);
  joining.flag = false;  // a node asking in
  joining.text = "node c is waiting to join";
  const std::vector<RecoveryRow> rows = {
      {"lost, every worker announced", recovering_job_in(P::kRunning), node_lost(true),
       "R log_warning rendezvous_keeping_workers"},
      {"lost while the silent workers' stacks are read: that silence was the wait",
       recovering_job_in(P::kCapturing), node_lost(true),
       "R forgive_hang log_warning rendezvous_keeping_workers"},
      {"a worker did not announce", recovering_job_in(P::kRunning), node_lost(false),
       "S log_warning stop_requested announce_restart stop_group"},
      {"a replacement in flight", recovering_job_in(P::kRunning), node_lost(true, true),
       "S log_warning stop_requested announce_restart stop_group"},
      {"a node asking in", recovering_job_in(P::kRunning), joining,
       "S log_warning stop_requested announce_restart stop_group"},
      {"a preemption notice", preempted, node_lost(true),
       "S log_warning stop_requested announce_restart stop_group"},
      {"--restart_scope group", job_in(P::kRunning), node_lost(true),
       "S log_warning stop_requested stop_group"},
      {"stopping already", recovering_job_in(P::kStopping), node_lost(true), "S"},
  };
  for (const RecoveryRow& row : rows) {
    StepResult r = step(row.state, row.event);
    EXPECT_EQ(outcome(r), row.outcome) << row.what;
    EXPECT_EQ(r.state.keeping_workers, r.state.phase == P::kRendezvous) << row.what;
  }
  StepResult no = step(recovering_job_in(P::kRunning), node_lost(false));
  EXPECT_NE(no.actions[0].text.find("not re-formed in process: not every worker here announced "
                                    "rank_recovery"),
            std::string::npos)
      << no.actions[0].text;
}

Steps kept_after_a_loss() {
  Steps run(recovering_job_in(P::kRunning));
  run.on(node_lost(true));
  EXPECT_EQ(run.s.phase, P::kRendezvous);
  return run;
}

TEST(AgentStepShrink, TheRoundOfTheSurvivorsShrinksTheGroupInPlace) {
  Steps run = kept_after_a_loss();
  run.s.round_restarts = 3;  // the budget is spent: a shrink is no restart
  run.on(kept_round(3, true));
  EXPECT_EQ(outcome({run.s, run.last}), "U shrink resume_hang_checks arm_hang_checks");
  EXPECT_EQ(run.last[0].text, "node b (node rank 2) lost (no keep-alive for 3 s)");
  EXPECT_EQ(run.s.generation, 0);  // the same workers, the same attempt
  EXPECT_EQ(run.s.restarts_used, 0);
  EXPECT_EQ(run.s.restart_count(), 3);
  EXPECT_FALSE(run.s.keeping_workers);
  EXPECT_TRUE(run.s.exit_barrier_due);
  // The group goes on as any: a later failure is the group's.
  run.on(plain(E::kWorkerFailed));
  EXPECT_EQ(outcome({run.s, run.last}), "S report_to_peers announce_restart stop_group");
}

// While the round forms the workers wait silently: hang events change nothing, a worker that
// ends makes the round restart the group, and the rest of the round's events are as usual.
TEST(AgentStepShrink, WhatArrivesWhileTheRoundForms) {
  const std::vector<RecoveryRow> rows = {
      {"a capture cannot start", kept_after_a_loss().s, plain(E::kCaptureStarted), "R"},
      {"no hang verdict", kept_after_a_loss().s, plain(E::kHangVerdict), "R"},
      {"a worker fails", kept_after_a_loss().s, plain(E::kWorkerFailed), "R log_warning"},
      {"a worker fails, announced", kept_after_a_loss().s, rank_failed(true), "R log_warning"},
      {"the store is lost", kept_after_a_loss().s, plain(E::kStoreLost),
       "S stop_requested stop_group"},
      {"a stop signal: this node leaves", kept_after_a_loss().s, signal_event(SIGTERM),
       "S timeline log_warning begin_leaving stop_requested announce_restart stop_group"},
      {"SIGUSR2 is forwarded", kept_after_a_loss().s, signal_event(SIGUSR2),
       "R timeline log_info forward"},
      {"the round fails", kept_after_a_loss().s, plain(E::kRoundFailed),
       "S stop_requested announce_restart stop_group"},
  };
  for (const RecoveryRow& row : rows) {
    EXPECT_EQ(outcome(step(row.state, row.event)), row.outcome) << row.what;
  }
}

// Each reason the round does not shrink: the group is stopped (the workers told `restart`),
// then started again in that round, not counted.
TEST(AgentStepShrink, OtherwiseTheGroupRestartsInTheNewRound) {
  struct Case {
    const char* what;
    std::vector<Event> before;
    Event formed;
  };
  const std::vector<Case> cases = {
      {"a new node in the round, or a survivor missing", {}, kept_round(0, false)},
      {"a worker ended meanwhile", {plain(E::kWorkerFailed)}, kept_round(0, true)},
      {"a failure elsewhere was counted", {}, kept_round(1, true)},
  };
  for (const Case& c : cases) {
    Steps run = kept_after_a_loss();
    for (const Event& e : c.before) run.on(e);
    run.on(c.formed);
    EXPECT_EQ(outcome({run.s, run.last}),
              "S log_warning stop_requested announce_restart stop_group")
        << c.what;
    run.on(group_down(GroupState::kStopped));
    EXPECT_EQ(outcome({run.s, run.last}), "R collect_group start_workers") << c.what;
    EXPECT_EQ(run.s.generation, 1) << c.what;
    EXPECT_EQ(run.s.restarts_used, 0) << c.what;
    EXPECT_EQ(run.s.round_restarts, c.formed.count) << c.what;
    run.on(E::kWorkersStarting);
    EXPECT_EQ(run.s.phase, P::kRunning) << c.what;
  }
}

// A stop while the kept group restarts in the new round still ends the job.
TEST(AgentStepShrink, ASignalDuringTheFallbackEndsTheJob) {
  Steps run = kept_after_a_loss();
  run.on(kept_round(0, false)).on(signal_event(SIGTERM));
  run.on(group_down(GroupState::kStopped));
  EXPECT_EQ(run.s.phase, P::kDone);
  EXPECT_EQ(run.s.exit_code, exit_codes::kSignalBase + SIGTERM);
  // A round that forms after the stop signal changes nothing.
  Steps late = kept_after_a_loss();
  late.on(signal_event(SIGTERM)).on(kept_round(0, true));
  EXPECT_EQ(outcome({late.s, late.last}), "S");
  late.on(group_down(GroupState::kStopped));
  EXPECT_EQ(late.s.exit_code, exit_codes::kSignalBase + SIGTERM);
}

TEST(AgentStepShrink, AFailedRoundStopsTheKeptWorkersThenExitsWithItsCode) {
  Steps run = kept_after_a_loss();
  Event mismatch{E::kRoundFailed};
  mismatch.code = exit_codes::kNodeMismatch;
  run.on(mismatch).on(group_down(GroupState::kStopped));
  EXPECT_EQ(run.s.phase, P::kDone);
  EXPECT_EQ(run.s.exit_code, exit_codes::kNodeMismatch);
  Steps lost = kept_after_a_loss();
  lost.on(plain(E::kStoreLost)).on(group_down(GroupState::kStopped));
  EXPECT_EQ(lost.s.exit_code, exit_codes::kWorkersFailed);
}

}  // namespace
}  // namespace dlaunch
