#include "launcher/agent/agent_decision.h"

#include "launcher/agent/agent.h"

namespace dlaunch {

namespace {

// A failure that spends the budget: restart while it lasts, else fail with the report.
Decision charge(const DecisionInput& in) {
  if (in.restarts_used < in.max_restarts) return Decision::restart(/*counted=*/true);
  return Decision::finish(exit_codes::kWorkersFailed, /*report=*/true);
}

}  // namespace

Decision decide(const DecisionInput& in) {
  // Read top to bottom: the first line that applies decides. What the agent was told (a
  // preemption, a signal, an unusable program) outranks how the workers happened to end.
  switch (in.cause.kind) {
    case StopKind::kPreempted:
      // The scheduler's SIGTERM that usually follows the notice is part of the preemption.
      return Decision::finish(exit_codes::kPreempted);
    case StopKind::kSignal:
      return Decision::finish(exit_codes::kSignalBase + in.cause.signal);
    case StopKind::kUsage:
      return Decision::finish(exit_codes::kUsage);
    default:
      break;
  }
  if (in.group == GroupState::kSucceeded) return Decision::finish(exit_codes::kSuccess);
  switch (in.cause.kind) {
    case StopKind::kStoreLost:
    case StopKind::kPeerShutdown:
      return Decision::finish(exit_codes::kWorkersFailed);
    case StopKind::kMembershipChange:
      return Decision::rejoin();
    default:
      break;
  }
  bool failed = in.group == GroupState::kFailed || in.group == GroupState::kUnhealthy ||
                in.cause.is(StopKind::kPeerRestart);
  if (!failed) return Decision::finish(exit_codes::kWorkersFailed);
  if (!in.multi_node) return charge(in);
  // Workers fail within a second of a peer node dying (their connections break), long before
  // the keep-alive can tell: ask the rendezvous before spending the budget.
  switch (in.verdict) {
    case FailureVerdictInput::kUnknown:
      return Decision::settle();
    case FailureVerdictInput::kNodeLost:
      return Decision::restart(/*counted=*/false);
    case FailureVerdictInput::kCounted:
      break;
  }
  return charge(in);
}

}  // namespace dlaunch
