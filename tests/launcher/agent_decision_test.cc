// The agent's decision once a worker group is down (launcher/agent/agent_decision.h), as a table: one
// row per case the agent meets, read like the state diagram in agent.h.
#include "launcher/agent/agent_decision.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "launcher/agent/agent.h"

namespace dlaunch {
namespace {

using A = Decision::Action;
using G = GroupState;
using K = StopKind;
using V = FailureVerdictInput;

StopCause cause_of(K k, int sig = 0) {
  StopCause c;
  if (k == K::kSignal) {
    c.record_signal(sig);
  } else {
    c.record(k);
  }
  return c;
}

struct Row {
  const char* name;
  G group;
  StopCause cause;
  int64_t used, budget;
  bool multi_node;
  V verdict;
  Decision want;
};

std::string describe(const Decision& d) {
  switch (d.action) {
    case A::kFinish:
      return "finish(" + std::to_string(d.exit_code) + (d.report ? ", report)" : ")");
    case A::kRestart:
      return d.counted ? "restart(counted)" : "restart(free)";
    case A::kRejoin:
      return "rejoin";
    case A::kSettle:
      return "settle";
  }
  return "?";
}

TEST(AgentDecision, Table) {
  const Decision fail = Decision::finish(exit_codes::kWorkersFailed);
  const Decision fail_report = Decision::finish(exit_codes::kWorkersFailed, true);
  // One row per case, read as a table.
  // clang-format off
  const std::vector<Row> rows = {
    // name                          group          cause                               used budget multi  verdict     want
    // The workers ended on their own.
    {"success",                      G::kSucceeded, {},                                  0, 3, false, V::kUnknown,  Decision::finish(0)},
    {"success, multi-node",          G::kSucceeded, {},                                  0, 3, true,  V::kUnknown,  Decision::finish(0)},
    {"failure within budget",        G::kFailed,    {},                                  0, 3, false, V::kUnknown,  Decision::restart(true)},
    {"last restart",                 G::kFailed,    {},                                  2, 3, false, V::kUnknown,  Decision::restart(true)},
    {"budget spent",                 G::kFailed,    {},                                  3, 3, false, V::kUnknown,  fail_report},
    {"no restarts allowed",          G::kFailed,    {},                                  0, 0, false, V::kUnknown,  fail_report},
    {"hung counts as failed",        G::kUnhealthy, {},                                  0, 1, false, V::kUnknown,  Decision::restart(true)},
    {"hung, budget spent",           G::kUnhealthy, {},                                  1, 1, false, V::kUnknown,  fail_report},
    {"stopped without a cause",      G::kStopped,   {},                                  0, 3, false, V::kUnknown,  fail},
    // Multi-node failures first ask the rendezvous whether a node was lost.
    {"multi-node failure asks",      G::kFailed,    {},                                  0, 3, true,  V::kUnknown,  Decision::settle()},
    {"node lost is free",            G::kFailed,    {},                                  3, 3, true,  V::kNodeLost, Decision::restart(false)},
    {"counted verdict",              G::kFailed,    {},                                  0, 3, true,  V::kCounted,  Decision::restart(true)},
    {"counted verdict, spent",       G::kFailed,    {},                                  3, 3, true,  V::kCounted,  fail_report},
    // What other nodes said.
    {"peer failure asks",            G::kStopped,   cause_of(K::kPeerRestart),           0, 3, true,  V::kUnknown,  Decision::settle()},
    {"peer failure, counted",        G::kStopped,   cause_of(K::kPeerRestart),           0, 3, true,  V::kCounted,  Decision::restart(true)},
    {"peer failure, spent",          G::kStopped,   cause_of(K::kPeerRestart),           1, 1, true,  V::kCounted,  fail_report},
    {"membership change rejoins",    G::kStopped,   cause_of(K::kMembershipChange),      3, 3, true,  V::kUnknown,  Decision::rejoin()},
    {"membership beats a failure",   G::kFailed,    cause_of(K::kMembershipChange),      0, 3, true,  V::kUnknown,  Decision::rejoin()},
    {"peer shutdown",                G::kStopped,   cause_of(K::kPeerShutdown),          0, 3, true,  V::kUnknown,  fail},
    {"store lost",                   G::kStopped,   cause_of(K::kStoreLost),             0, 3, true,  V::kUnknown,  fail},
    {"store lost after a failure",   G::kFailed,    cause_of(K::kStoreLost),             0, 3, true,  V::kUnknown,  fail},
    // A success outranks what other nodes said meanwhile.
    {"success beats store lost",     G::kSucceeded, cause_of(K::kStoreLost),             0, 3, true,  V::kUnknown,  Decision::finish(0)},
    {"success beats membership",     G::kSucceeded, cause_of(K::kMembershipChange),      0, 3, true,  V::kUnknown,  Decision::finish(0)},
    // What the agent was told outranks how the workers ended.
    {"usage",                        G::kFailed,    cause_of(K::kUsage),                 0, 3, false, V::kUnknown,  Decision::finish(exit_codes::kUsage)},
    {"usage, multi-node",            G::kFailed,    cause_of(K::kUsage),                 0, 3, true,  V::kUnknown,  Decision::finish(exit_codes::kUsage)},
    {"SIGTERM",                      G::kStopped,   cause_of(K::kSignal, SIGTERM),       0, 3, false, V::kUnknown,  Decision::finish(128 + SIGTERM)},
    {"SIGINT after a success",       G::kSucceeded, cause_of(K::kSignal, SIGINT),        0, 3, false, V::kUnknown,  Decision::finish(128 + SIGINT)},
    {"preempted, workers exited 0",  G::kSucceeded, cause_of(K::kPreempted),             0, 3, false, V::kUnknown,  Decision::finish(exit_codes::kPreempted)},
    {"preempted, workers failed",    G::kFailed,    cause_of(K::kPreempted),             0, 3, true,  V::kUnknown,  Decision::finish(exit_codes::kPreempted)},
  };
  // clang-format on
  for (const Row& r : rows) {
    DecisionInput in;
    in.group = r.group;
    in.cause = r.cause;
    in.restarts_used = r.used;
    in.max_restarts = r.budget;
    in.multi_node = r.multi_node;
    in.verdict = r.verdict;
    Decision got = decide(in);
    EXPECT_TRUE(got == r.want) << r.name << ": got " << describe(got) << ", want "
                               << describe(r.want);
  }
}

// A stronger cause replaces the recorded one; a weaker or equal one does not.
TEST(AgentDecision, StopCauseKeepsTheStrongest) {
  StopCause c;
  c.record(K::kPeerRestart);
  c.record(K::kMembershipChange);
  EXPECT_EQ(c.kind, K::kMembershipChange);
  c.record(K::kPeerRestart);
  EXPECT_EQ(c.kind, K::kMembershipChange);

  // A membership restart interrupted by SIGTERM ends the job.
  c.record_signal(SIGTERM);
  EXPECT_EQ(c.kind, K::kSignal);
  EXPECT_EQ(c.signal, SIGTERM);
  c.record_signal(SIGINT);  // the first signal is the exit code
  EXPECT_EQ(c.signal, SIGTERM);

  // SIGUSR1 then SIGTERM (the scheduler's usual order) and the reverse: still preempted, and
  // the SIGTERM is remembered so a second one kills at once.
  StopCause p;
  p.record(K::kPreempted);
  p.record_signal(SIGTERM);
  EXPECT_EQ(p.kind, K::kPreempted);
  EXPECT_EQ(p.signal, SIGTERM);
  StopCause q;
  q.record_signal(SIGTERM);
  q.record(K::kPreempted);
  EXPECT_EQ(q.kind, K::kPreempted);
  DecisionInput in;
  in.group = G::kStopped;
  in.cause = q;
  EXPECT_EQ(decide(in).exit_code, exit_codes::kPreempted);
}

// A new generation spends the causes that asked for it and keeps the others.
TEST(AgentDecision, NewGenerationKeepsAPreemption) {
  StopCause m = cause_of(K::kMembershipChange);
  m.new_generation();
  EXPECT_EQ(m.kind, K::kNone);
  StopCause r = cause_of(K::kPeerRestart);
  r.new_generation();
  EXPECT_EQ(r.kind, K::kNone);
  StopCause p = cause_of(K::kPreempted);
  p.new_generation();
  EXPECT_EQ(p.kind, K::kPreempted);
}

}  // namespace
}  // namespace dlaunch
