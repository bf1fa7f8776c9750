// The local worker group of one generation (one rendezvous round, one attempt) and its state
// machine. Pure bookkeeping: no processes, no I/O, time passed in, so it is unit-tested with a
// FakeClock. The agent (agent.h) drives it and does the I/O.
//
//            all spawned          every worker exited 0
//   Init ----------------> Healthy ----------------------> Succeeded
//    |                      |  |  |
//    | spawn failed         |  |  +-- a worker's heartbeat is too old --> Unhealthy (hung) --+
//    +--------------------->|  +----- a worker failed (exit != 0, signal) --> Failed -------+
//                           |                                                               |
//                           +-- agent signal / peer restart / membership change --> Stopped-+
//                                                                                           |
//          the agent stops the rest (SIGTERM, grace, SIGKILL); the first failure stays the  |
//          root cause and later exits are consequences; then it restarts or gives up  <----+
//
// Succeeded, Failed, Unhealthy and Stopped are final for the generation: once one is reached,
// further events only record what happened to the remaining workers.
//
// A worker replaced alone (rank recovery, launcher/agent/rank_replacement.h) does not fail the
// group: begin_replacement() marks its record before its exit is recorded (a hang already
// declared is taken back: Unhealthy -> Healthy), restart_worker() keeps the ended record in
// replaced() for the report and makes the record new for the replacement's on_started.
//
//   Running --begin_replacement--> Running (replacing) --on_exit--> Failed (replacing)
//      ^                                                                  |
//      +---------- on_started <-- Init (replacement) <-- restart_worker --+
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "launcher/process/exit_status.h"

namespace dlaunch {

enum class GroupState { kInit, kHealthy, kSucceeded, kFailed, kUnhealthy, kStopped };
const char* group_state_name(GroupState s);

enum class WorkerState { kInit, kRunning, kSucceeded, kFailed, kStopped };

struct WorkerRecord {
  int64_t local_rank = 0;
  int64_t global_rank = 0;
  int pid = -1;
  WorkerState state = WorkerState::kInit;
  TimePoint started{};
  std::chrono::system_clock::time_point started_wall{};
  std::optional<ExitStatus> exit;
  TimePoint exited{};
  std::chrono::system_clock::time_point exited_wall{};
  bool hung = false;       // declared hung (its exit afterwards is our SIGTERM/SIGKILL)
  bool abandoned = false;  // did not die after SIGKILL within the bound; no longer waited on
  bool replacing = false;  // its failure is taken by replacing it alone, not by the group
  bool replacement = false;  // started in place of a failed worker of this generation
  int64_t replacements = 0;  // how often this local rank was replaced in this generation
  std::string error_file;
  std::string heartbeat_file;
  std::string log_dir;  // per-rank directory (stdout.log, stderr.log, error.json, stack.txt)
  std::deque<std::string> stderr_tail;  // the last lines, for the report
  // After a hang (hang_diagnosis.h): where its main thread was, and its Python stack.
  std::string hang_where;
  std::string python_stack;
  // Declared hung by --hang_timeout auto: how long it had been silent, the timeout it was
  // judged by and why (launcher/hang/hang_pace.h); empty with a fixed --hang_timeout.
  Duration hang_silence{0};
  Duration hang_timeout{0};
  std::string hang_rule;

  bool running() const { return state == WorkerState::kRunning && !abandoned; }
};

class WorkerGroup {
 public:
  static constexpr size_t kTailLines = 50;

  // A new generation; every record in kInit.
  WorkerGroup(int64_t attempt, std::vector<WorkerRecord> workers);

  GroupState state() const { return state_; }
  int64_t attempt() const { return attempt_; }
  std::vector<WorkerRecord>& workers() { return workers_; }
  const std::vector<WorkerRecord>& workers() const { return workers_; }
  WorkerRecord& worker(int64_t local_rank);
  const WorkerRecord& worker(int64_t local_rank) const;

  void on_started(int64_t local_rank, int pid, TimePoint now,
                  std::chrono::system_clock::time_point wall);
  // A worker exited. While Healthy: a failure moves the group to Failed and makes this worker
  // the root cause; the last successful exit moves it to Succeeded. Afterwards: recorded only.
  void on_exit(int64_t local_rank, const ExitStatus& status, TimePoint now,
               std::chrono::system_clock::time_point wall);
  // A worker's heartbeat is older than the hang timeout. Healthy -> Unhealthy.
  void on_hung(int64_t local_rank, TimePoint now, std::chrono::system_clock::time_point wall);
  // The stacks showed that this hung worker, not the one on_hung named, is the one stuck (the
  // others wait for it in a collective): it becomes the root cause. Only while Unhealthy.
  void blame_hang(int64_t local_rank);
  // The silent workers only waited for a rank stuck on another node, which that node replaces
  // alone: Unhealthy -> Healthy, no root cause. Only while Unhealthy.
  void forgive_hang();
  // The group must stop for a reason outside it (signal, peer, membership). Init/Healthy ->
  // Stopped; a final state is kept.
  void on_stop_requested(const std::string& reason);
  // Spawning failed before every worker started: Init -> Failed.
  void on_spawn_failed(const std::string& reason);
  void on_abandoned(int64_t local_rank);
  // The worker's failure (its exit, recorded next, or its hang, declared already) is taken by
  // replacing it alone: the group stays (or, after a hang, is again) Healthy. Only while Healthy,
  // or Unhealthy with this worker as the root cause; false otherwise.
  bool begin_replacement(int64_t local_rank);
  // The replaced worker has exited: its record goes to replaced() and the record starts over
  // (Init, no pid) for its replacement, on_started next.
  void restart_worker(int64_t local_rank);
  // Its replacement could not be announced or started: the failure is the group's after all
  // (Healthy -> Failed, this worker the root cause).
  void replacement_failed(int64_t local_rank);
  // The group shrank in place (a node was lost): its workers' global ranks are now
  // `first_rank` + local rank. The records in replaced() keep the ranks they had.
  void renumber(int64_t first_rank);
  // The records of the workers replaced alone in this generation, as they ended, in order.
  const std::vector<WorkerRecord>& replaced() const { return replaced_; }
  void add_stderr_line(int64_t local_rank, std::string line);

  bool all_exited() const;  // every started worker exited or was abandoned
  bool final() const;
  // The root cause, when the group Failed or went Unhealthy.
  std::optional<int64_t> root_cause() const { return root_cause_; }
  const std::string& stop_reason() const { return stop_reason_; }

  // Pure hang rule: the last sign of life is the later of the start and the last heartbeat
  // (`last_beat`: any touch of the armed file, launcher/hang/heartbeat_file.h). A
  // worker that never beat is hung only when `from_start` (--hang_timeout_from_start): by
  // default one that does not heartbeat at all (a program that knows nothing of dlaunch, or a
  // Python script before its first optimizer step) is healthy, not hung.
  static bool is_hung(TimePoint started, std::optional<TimePoint> last_beat, TimePoint now,
                      Duration timeout, bool from_start);

 private:
  int64_t attempt_;
  std::vector<WorkerRecord> workers_;
  std::vector<WorkerRecord> replaced_;
  GroupState state_ = GroupState::kInit;
  std::optional<int64_t> root_cause_;
  std::string stop_reason_;
};

}  // namespace dlaunch
