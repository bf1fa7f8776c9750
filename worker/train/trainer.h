// The training loop of dtrain: data, model, DDP, optimizer, schedule, evaluation, metrics and
// checkpoints, for one rank of the job.
//
//   start -> resume? (rank 0 reads, everyone receives by broadcast) -> per epoch:
//            [ train steps (heartbeat and stop-signal agreement each) -> epoch totals
//              all-reduced -> eval (all-reduced) -> epoch line + metrics (rank 0)
//              -> checkpoint (rank 0) ] -> curves.svg (rank 0)
//   a stop signal (SIGUSR1/SIGTERM) seen by any rank -> every rank stops after the same step
//            -> a checkpoint inside the epoch (rank 0) -> run() returns with stop_signal set
//
// Every rank runs run(); all collective calls happen in the same order on every rank. The parts:
// where a run starts (resume.h, one ResumePoint), what a checkpoint holds and writing it
// (checkpointing.h), the data (training_data.h), divergence (divergence.h), metrics.jsonl and
// the curves (run_metrics.h); trainer.cc keeps the loop: epochs, steps, evaluation.
// run() blocks for the whole training and throws on failure: UsageError (a checkpoint from a
// different model/dataset, bad data dir), data::DataError, ckpt::CheckpointError (an explicit
// --resume PATH that is corrupt), TimeoutError/ConnectionError (a peer died), DivergedError
// (the loss or the weights became inf/NaN: every rank throws it at the same step, and no
// checkpoint of that state is written).
//
// With rank-level recovery (`recovery` not null: rank_recovery.h) a peer's death inside a
// training step does not end run(): the step is rolled back (BN statistics, step sums), the
// group re-formed with the replacement, which takes the state from the survivors, and the step
// redone with the same batch; a death after the step's optimizer step leaves the rest of that
// step's logging out. The losses are those of a run without the death, bit for bit. A death
// elsewhere (evaluation, the epoch's end, checkpoints) throws as before. When the agent shrinks
// the group instead (a node lost), the interrupted step is rolled back and not redone: this
// worker goes on as its new rank of the smaller world, with the rest of the epoch from the exact
// sample position shared anew, its batch as --elastic_batch says, and rank 0's duties if it is
// the new rank 0.
#pragma once

#include <csignal>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/worker_env.h"
#include "kernels/backend.h"
#include "worker/comm/process_group.h"
#include "worker/train/divergence.h"  // DivergedError
#include "worker/train/fault_injection.h"
#include "worker/train/train_config.h"

namespace dlaunch::train {

class RankRecovery;
struct PreparedStart;

struct TrainSummary {
  int64_t epochs_done = 0;  // completed epochs, counting those restored from a checkpoint
  int64_t steps = 0;        // optimizer steps in total, idem
  // An epoch left unfinished (by --max_steps or a stop signal): its number (1-based), the steps
  // of it done and the steps it has. 0 when the last epoch trained was complete.
  int64_t partial_epoch = 0;
  int64_t partial_epoch_steps = 0;
  int64_t partial_epoch_of = 0;
  // SIGUSR1 or SIGTERM when training stopped early for a signal (stop_signal.h), with the
  // checkpoint written at the stop.
  int stop_signal = 0;
  std::string stop_checkpoint;
  double test_loss = 0;     // of the last evaluation (NaN if none ran)
  double test_accuracy = 0;
  bool resumed = false;
  std::string resumed_from;
};


// Trains on `backend` (kernels/device.h picks it): the model, its gradients and the optimizer
// state live there; batches are loaded on the host and copied over, or, with --data_on_device,
// made there from the uploaded splits (train/epoch_batches.h); checkpoints hold host copies, so
// they are the same whatever the device.
// `prepared`: the data and model a replacement made ready while it joined the group
// (prepared_start.h), taken from there; null: loaded and built here.
TrainSummary run_training(const TrainConfig& config, const WorkerEnv& env, comm::ProcessGroup& pg,
                          kernels::Backend& backend, const FaultInjection& fault = {},
                          RankRecovery* recovery = nullptr, PreparedStart* prepared = nullptr);

}  // namespace dlaunch::train
