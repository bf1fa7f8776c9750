// Starting a generation's workers and seeing them end: the worker group (worker_group.h) is
// made from the round, each worker is spawned with the contract (worker_environment.h) and its
// output routed (log_router.h); exits and programs that cannot be executed move the group to
// its final state, and the agent's stopping follows. Loop thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/output/filtered_copy.h"
#include "launcher/output/log_router.h"
#include "launcher/output/partial_line_timer.h"
#include "launcher/process/process_context.h"
#include "launcher/agent/agent_context.h"
#include "launcher/agent/node_store_proxy.h"
#include "launcher/agent/worker_environment.h"

namespace dlaunch {

class WorkerSupervisor {
 public:
  explicit WorkerSupervisor(AgentContext& agent);

  // Before the first generation: OMP_NUM_THREADS for every worker (logged once).
  void prepare();
  // A new generation for the round just formed (AgentContext::last_round): its worker group,
  // then every worker spawned.
  void start();
  // A worker replaced alone has exited (WorkerRecord::replacing): announce the next generation
  // in the store and start its replacement with the same contract and DLAUNCH_REPLACEMENT=1.
  // When it cannot be announced, the failure is the group's after all (kWorkerFailed).
  void respawn(int64_t local_rank);
  // The group shrank in place to the round just formed (AgentContext::last_round): its
  // workers' new ranks, and the round a later replacement is started with.
  void shrank();
  // At the job's end: the log files that could not take all of their worker's output (a full
  // disk), with what is missing from each; nothing when none.
  void report_output_losses() const;

 private:
  AgentContext& agent_;
  std::string omp_threads_;
  const bool console_is_terminal_;
  bool exec_failure_logged_ = false;  // "cannot execute" is said once per job
  std::vector<std::shared_ptr<WorkerOutput>> outputs_;
  // This generation's --duplicate_*_filters files; null without the flags.
  std::shared_ptr<FilteredCopy> filtered_;
  std::vector<std::shared_ptr<const OutputLoss>> output_losses_;  // every generation's
  PartialLineTimer partial_lines_;
  NodeStoreProxy store_proxy_;  // --store_proxy: what MASTER_ADDR/MASTER_PORT name
  // The current generation's round in the workers' view, their placement and console: a
  // replacement is started with exactly what its group was.
  std::optional<RendezvousResult> round_;
  WorkerPlacement place_;
  std::shared_ptr<SharedConsole> console_;

  // Spawns `local_rank`; false when it could not be (the group is then being stopped).
  bool spawn(const RendezvousResult& r, WorkerPlacement place, int64_t local_rank,
             const std::shared_ptr<SharedConsole>& console);
  ProcessCallbacks callbacks(int64_t local_rank, const std::shared_ptr<WorkerOutput>& out,
                             const std::string& prefix);
  void on_exit(int64_t gen, int64_t local_rank, const ExitStatus& st);
  // A failure in a healthy group: step() may take it by replacing the worker alone (it then
  // marks the record replacing). The facts it decides on: the announcement, replacements still
  // in flight.
  void offer_replacement(int64_t local_rank, const ExitStatus& st);
  void on_output_loss(std::shared_ptr<const OutputLoss> loss);
  // The program was found but could not be executed: a usage problem, no restart helps.
  void on_exec_failed(int64_t gen, int64_t local_rank, const std::string& message);
  void log_spawn_error(const std::string& message);
};

}  // namespace dlaunch
