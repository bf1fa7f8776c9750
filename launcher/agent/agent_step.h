// The agent's lifecycle as one pure function: step(state, event) -> (state, actions). Every
// change of what the agent is doing (its phase), why it stops the workers (the cause), the
// restart budget, the generation and a failure being settled is made here and nowhere else; the
// agent's parts (agent_context.h) carry out the actions and post what they see as events. The
// group-is-down table is decide() (agent_decision.h), one case of step. Kept free of processes,
// timers and threads so that every event in every phase is tested as a table
// (tests/launcher/agent_step_test.cc); agent.h describes the lifecycle in words.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "launcher/agent/agent_decision.h"
#include "launcher/process/worker_group.h"

namespace dlaunch {

// What the agent is doing; /status shows it (agent_phase_name).
enum class AgentPhase { kRendezvous, kRunning, kCapturing, kStopping, kExitBarrier, kDone };
const char* agent_phase_name(AgentPhase p);

struct AgentState {
  AgentPhase phase = AgentPhase::kRendezvous;
  // Why the agent stops the group, if the workers do not end on their own; decide() reads it
  // when the group is down.
  StopCause cause;
  int64_t generation = -1;  // generations started (DLAUNCH_ATTEMPT)
  int64_t restarts_used = 0;
  // Ranks replaced alone in the current round (rank_recovery): each spent one restart, which a
  // round's job-wide count does not know of.
  int64_t round_replacements = 0;
  // The job-wide restart count of the current round (several nodes agree on it); none before
  // the first round.
  std::optional<int64_t> round_restarts;
  // A failure's verdict is awaited from the rendezvous (RendezvousHandler::settle_failure).
  bool settling = false;
  // What the verdict completes: the group's end as it was when it went down, or (after this
  // node's success) another node's failure, `peer_failure`.
  bool settling_after_success = false;
  DecisionInput settling_input;
  std::string peer_failure;
  // The rendezvous declared the job's store gone: why, in one sentence.
  std::string store_lost;
  // The current round has several nodes sharing a store: a success waits at the exit barrier.
  bool exit_barrier_due = false;
  bool passed_exit_barrier = false;  // every node is past it
  int exit_code = 0;

  // Fixed for the job.
  int64_t max_restarts = 0;
  bool multi_node = false;   // a rendezvous exists
  bool hang_checks = false;  // --hang_timeout is set
  // --restart_scope rank with an agent's store: a failed worker that announced rank_recovery
  // may be replaced alone (the contract: common/worker_env.h, kRecoveryKey).
  bool rank_recovery = false;

  // A node of the round was lost and every worker here can re-form in process: the agent
  // re-rendezvouses while its workers run on (silent, waiting for the verdict). The round that
  // forms either shrinks the group in place (kShrink) or, failing that, the group is stopped and
  // started again in that round (`pending_round`).
  bool keeping_workers = false;
  // A kept worker ended meanwhile: the group can no longer re-form in process.
  bool kept_group_broken = false;
  std::string lost_node;  // the rendezvous's sentence for the loss, for the shrink's log line
  // A round formed while the kept group is being stopped: its workers start once it is down.
  struct PendingRound {
    int64_t restart_count = 0;
    bool exit_barrier_due = false;
  };
  std::optional<PendingRound> pending_round;
  // The rendezvous failed while the workers were kept: they are stopped, then the agent exits
  // with the round's code.
  std::optional<int> exit_after_stop;

  // The restart count of the current round (the job-wide one on several nodes), with the ranks
  // replaced since it formed.
  int64_t restart_count() const {
    return round_restarts ? *round_restarts + round_replacements : restarts_used;
  }
};

// What a part saw. One struct for every kind keeps the table test and the posting sites short;
// each kind says which fields it uses.
struct Event {
  enum class Kind {
    kStart,                 // run() begins
    kRoundFormed,           // count: the round's restart count; flag: several nodes, a store;
                            // after a rendezvous with the workers kept, every_node_kept: every
                            // node of the round kept its workers and none that did is missing
    kRoundFailed,           // code: 1, or 78 when the nodes' settings disagree
    kJobFinishedElsewhere,  // a spare node: the job succeeded without it
    kAttemptFailed,         // the generation's files could not be made
    kWorkersStarting,       // the group exists; its workers are being spawned
    kWorkersSpawned,        // every worker of the group started
    kSpawnFailed,           // a worker could not be started; flag: the program is unusable
    kExecFailed,            // a worker's program cannot be executed; group, all_exited, flag: the
                            // group was final before
    kWorkerFailed,          // the group just failed; text: this node's failure for the others
    kWorkerExited,          // any other exit; group, all_exited
    kGroupDown,             // the group and everything it left are down; group
    kPeerEvent,             // pushed by the rendezvous; peer, text: its reason; for a
                            // membership change: flag: a node of the round died or left (not
                            // one asking in); announced: every local worker announced
                            // rank_recovery and runs; in_flight: a replacement here has not
                            // beaten yet
    kStoreLost,             // text: the rendezvous's sentence
    kFailureVerdict,        // generation, verdict, text: the reason
    kSignal,                // signal; text: who asked (`dlaunch stop`), empty for a real signal
    kCaptureStarted,        // hung (or silent) workers' stacks are being read
    kHangVerdict,           // the hang is judged; flag: asked by a peer; text: for the others
    kNothingToInvestigate,  // a peer's restart request found no silent worker here
    kControlStop,           // `dlaunch stop`; text: who
    kControlRestart,        // `dlaunch restart`; text: who
    kBarrierDone,           // generation; flag: every node passed
    kRankFailed,  // a worker failed (or, `hung`, was judged the hung one) while the group was
                  // healthy, before the group takes it as its failure; count: its local rank;
                  // flag: it announced rank_recovery; in_flight: an earlier replacement here has
                  // not beaten yet; text: "rank R (local L, pid P) <what happened>"
    kHangReplacedElsewhere,  // the hang is judged: its stuck rank is on another node, which
                             // replaces it alone (NodeHangVerdict::replaceable); flag: asked by
                             // a peer; text: for the others, as kHangVerdict's
  };
  enum class Peer { kMembershipChanged, kRestartRequested, kShutdownRequested };
  enum class Verdict { kCounted, kNodeLost, kStoreLost };

  Kind kind = Kind::kStart;
  int code = 0;
  int signal = 0;
  int64_t count = 0;
  int64_t generation = 0;
  bool flag = false;
  bool all_exited = false;
  bool hung = false;
  bool in_flight = false;
  bool announced = false;
  bool every_node_kept = false;
  GroupState group = GroupState::kInit;
  Peer peer = Peer::kMembershipChanged;
  Verdict verdict = Verdict::kCounted;
  std::string text;
};

// What the parts do about it, in order.
struct Action {
  enum class Kind {
    kBeginGeneration,     // a new round (the single node: its own)
    kStartWorkers,        // the group for the round just formed, its workers spawned
    kArmHangChecks,       // heartbeat checks while the workers run
    kStopRequested,       // text: the reason the group records (WorkerGroup::on_stop_requested)
    kStopGroup,           // signal to every worker, SIGKILL after --shutdown_grace
    kStopLeftovers,       // the workers exited 0: what they left gets the grace
    kKillNow,             // a second stop signal: SIGKILL without waiting; signal: it
    kForward,             // signal to every running worker
    kBeginLeaving,        // tell the other nodes this node leaves, before its workers die
    kReportToPeers,       // text: this node's failure, published for the others
    kInvestigateForPeer,  // read silent workers' stacks before stopping (else
                          // kNothingToInvestigate)
    kSettle,              // ask the rendezvous whether a node was lost (kFailureVerdict follows)
    kCollectGroup,        // the group is down: kill what remains in its process groups
    kSayWhyFinished,      // code; the cause is the state's
    kReportFailure,       // count: restarts used; the failure report and the parent's error file
    kRecordRestart,  // flag: counted; count: the restart count it started from; text: why (free)
    kRecordPeerFailure,  // text: another node's failure, for the report
    kCancelTimers,       // the job ends: no stop or hang timer fires any more
    kStartExitBarrier,   // wait for every node to succeed (kBarrierDone follows)
    kFinishNow,          // code: exit with it
    kPauseHangChecks,    // SIGTSTP: the workers are being stopped
    kResumeHangChecks,   // SIGCONT
    kStopSelf,           // SIGSTOP dlaunch itself
    kReapOrphans,        // SIGCHLD
    kSignalLater,        // signal, text: who; posted as kSignal once the answer is on its way
    kTimeline,           // text: the event's name; detail: its one field (signal)
    kLogInfo,            // text
    kLogWarning,         // text
    kLogError,           // text
    kAnswer,             // code: HTTP status; text: the answer to a control request
    kReplaceRank,        // count: the local rank replaced alone; code: the restart it spends (1 is
                         // the first); flag: it hung (kill it first); text: the log line
    kAnnounceRestart,    // the group is being stopped: tell workers that opted in to exit at once
    kForgiveHang,        // the silent workers here only waited for a rank replaced elsewhere
                         // (or a lost node): the group is healthy again and their silence so
                         // far is no hang
    kRendezvousKeepingWorkers,  // a new round while the workers run on (kRoundFormed follows)
    kShrink,  // the round just formed holds exactly the nodes that kept their workers: tell
              // them their new ranks and world size in the store; text: the loss, for the log
  };
  Kind kind;
  int code = 0;
  int signal = 0;
  int64_t count = 0;
  bool flag = false;
  std::string text;

  bool operator==(const Action& o) const {
    return kind == o.kind && code == o.code && signal == o.signal && count == o.count &&
           flag == o.flag && text == o.text;
  }
};
const char* action_name(Action::Kind k);
const char* event_name(Event::Kind k);

struct StepResult {
  AgentState state;
  std::vector<Action> actions;
};

StepResult step(AgentState state, const Event& event);

}  // namespace dlaunch
