// What the agent does once a generation's worker group has stopped: one pure function of the
// group's final state, why the agent stopped it, and the restart budget. The agent records the
// cause as events arrive (StopCause::record) and calls decide() when the group is down; all
// logging, reporting and side effects stay in the agent (agent.cc). Kept apart so the whole
// table is tested without processes, timers or a loop (tests/launcher/agent_decision_test.cc).
#pragma once

#include <cstdint>

#include "launcher/process/worker_group.h"

namespace dlaunch {

// Why the agent stopped the group, if the workers did not end on their own. Declared weakest
// first: a later cause replaces the recorded one only if it is stronger (so a SIGTERM after a
// preemption notice still means preempted, and a signal during a membership restart ends the
// job), otherwise the first one recorded stands.
enum class StopKind {
  kNone,              // the workers ended on their own
  kPeerRestart,       // another node failed: a job-wide restart (counted as a failure)
  kMembershipChange,  // a node joined or left: re-form the group (not counted)
  kPeerShutdown,      // another node closed the job
  kStoreLost,         // the job's store is gone: no round can form again
  kUsage,             // the program cannot be executed here: no restart helps
  kSignal,            // SIGINT, SIGTERM or SIGHUP reached the agent
  kPreempted,         // SIGUSR1, the scheduler's preemption notice: exit for a requeue
};

struct StopCause {
  StopKind kind = StopKind::kNone;
  // The first terminating signal, the exit code of kSignal. Kept under a preemption too: a
  // second terminating signal while the workers stop kills them at once either way.
  int signal = 0;

  // Keeps the stronger of the recorded cause and `k` (the first of equals).
  void record(StopKind k) {
    if (k > kind) kind = k;
  }
  void record_signal(int sig) {
    if (signal == 0) signal = sig;
    record(StopKind::kSignal);
  }
  // A new generation starts: the causes that asked for it are spent; the others (a preemption
  // notice that arrived while the job re-formed) still decide how it ends.
  void new_generation() {
    if (kind == StopKind::kPeerRestart || kind == StopKind::kMembershipChange) *this = {};
  }
  bool is(StopKind k) const { return kind == k; }
};

// Whether a failed round on a multi-node job lost a node (RendezvousHandler::settle_failure).
enum class FailureVerdictInput {
  kUnknown,   // not asked yet
  kCounted,   // an ordinary failure: it spends the budget
  kNodeLost,  // a peer node died: re-form with the rest for free
};

struct DecisionInput {
  GroupState group = GroupState::kInit;
  StopCause cause;
  int64_t restarts_used = 0;  // the job-wide restart count of the round
  int64_t max_restarts = 0;
  bool multi_node = false;  // a rendezvous exists, so a failure may be a lost node
  FailureVerdictInput verdict = FailureVerdictInput::kUnknown;
};

struct Decision {
  enum class Action {
    kFinish,   // exit with `exit_code` (0 may still wait at the exit barrier)
    kRestart,  // a new generation after a failure; `counted` spends the budget
    kRejoin,   // a new generation after a membership change: nothing failed
    kSettle,   // ask the rendezvous whether a node was lost, then decide again with its verdict
  };
  Action action = Action::kFinish;
  int exit_code = 0;     // kFinish
  bool counted = false;  // kRestart
  // kFinish after a failure whose budget is spent: print the failure report.
  bool report = false;

  static Decision finish(int code, bool report = false) {
    return {Action::kFinish, code, false, report};
  }
  static Decision restart(bool counted) { return {Action::kRestart, 0, counted, false}; }
  static Decision rejoin() { return {Action::kRejoin, 0, false, false}; }
  static Decision settle() { return {Action::kSettle, 0, false, false}; }
  bool operator==(const Decision& o) const {
    return action == o.action && exit_code == o.exit_code && counted == o.counted &&
           report == o.report;
  }
};

Decision decide(const DecisionInput& in);

}  // namespace dlaunch
