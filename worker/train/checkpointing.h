// dtrain's checkpoints, written: what one holds (build_checkpoint: host copies of the arrays, so
// the file is the same whatever the device), rank 0's disk checkpoints (encoded once, copied to
// the flash directory, then written, fsynced and pruned on a background thread) and the
// mid-epoch flash copies of --flash_every on each node's local rank 0.
//
// Blocking: save() and save_flash() encode on the calling thread; the flash copy is a write to
// memory (tmpfs). Errors: a flash write that fails (ENOSPC beyond --flash_limit) turns flash
// copies off with one warning, training goes on with disk checkpoints; a failed disk write is
// rethrown (SystemError) by the next save() or by wait_for_disk(). One owner thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/worker_env.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/flash_checkpoint.h"
#include "worker/comm/process_group.h"
#include "worker/data/dataset.h"
#include "worker/model/resnet.h"
#include "worker/optim/optimizer.h"
#include "worker/optim/weight_ema.h"
#include "worker/train/epoch_totals.h"
#include "worker/train/precision.h"
#include "worker/train/train_config.h"

namespace dlaunch::train {

// What a checkpoint holds of the training at the moment it is written.
struct TrainingState {
  model::ResNet& model;
  const optim::Optimizer& optimizer;
  const optim::WeightEma* ema;          // null: --ema off
  const MixedPrecision& precision;      // fp16's loss scale
  const data::ImageDataset& train_set;  // for the model signature
  int64_t global_step = 0;
  double test_loss = 0;  // the last evaluation (NaN: none ran), for a resume with nothing to train
  double test_accuracy = 0;
  // Each rank's batch, which a position's steps count in (0: --batch_size); not --batch_size
  // after a shrink with --elastic_batch global.
  int64_t batch_size = 0;
  // --elastic_batch global: the global batch kept through shrinks (0: none recorded).
  int64_t global_batch = 0;
};

// Where in the training a checkpoint is written.
struct CheckpointPosition {
  int64_t epochs_done = 0;
  // > 0: inside epoch epochs_done + 1, after this many of its steps, with the epoch's totals so
  // far summed over the ranks; `seen_before` the prefix of its permutation trained by another
  // world before it began here (0: it began at its start).
  int64_t epoch_step = 0;
  int64_t seen_before = 0;
  EpochTotals totals;
};

// The checkpoint of `state` at `at`, written by run `run_id` in a world of `world_size` ranks.
ckpt::Checkpoint build_checkpoint(const TrainConfig& config, const std::string& run_id,
                                  int world_size, const TrainingState& state,
                                  const CheckpointPosition& at);

// build_checkpoint's, encoded: the bytes of a flash copy and of a disk checkpoint, and what a
// surviving rank sends a replacement (peer_state.h; resume_from_peer loads them).
std::vector<uint8_t> encode_training_state(const TrainConfig& config, const std::string& run_id,
                                           int world_size, const TrainingState& state,
                                           const CheckpointPosition& at);

class Checkpointer {
 public:
  Checkpointer(const TrainConfig& config, comm::ProcessGroup& pg);
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // With --flash_every, each node's local rank 0 keeps a flash copy in the job's flash directory
  // (rank 0's node may not be the one that hosts rank 0 after a re-rendezvous). A directory that
  // cannot be made is a warning: no flash copies.
  void open_flash(const WorkerEnv& env);
  // Where this rank's flash copies are ("" when it keeps none).
  std::string flash_dir() const;
  // Every rank: the identity written into every checkpoint and flash copy of this run (resume.h
  // settles it).
  void set_run_id(std::string run_id) { run_id_ = std::move(run_id); }

  // Rank 0 writes the checkpoint (the flash copy at once, the disk file in the background, the
  // run's older ones pruned to the newest 3). Returns the disk path ("" on other ranks).
  std::string save(const TrainingState& state, const CheckpointPosition& at);
  // --flash_every: the flash copy after a step inside an epoch; nothing on a rank without one.
  void save_flash(const TrainingState& state, const CheckpointPosition& at);
  // Waits until the checkpoints handed to the background writer are on disk.
  void wait_for_disk() { persister_.wait(); }
  // Rank 0: the mid-epoch flash copies' count and average cost, when there were any.
  void log_flash_costs() const;

 private:
  // A failure turns flash copies off with one warning naming `global_step`.
  void write_flash(const std::string& name, const std::vector<uint8_t>& bytes, int64_t global_step);

  const TrainConfig& config_;
  comm::ProcessGroup& pg_;
  std::string run_id_;
  std::unique_ptr<ckpt::FlashWriter> flash_;  // null: no flash copies on this rank
  int64_t flash_writes_ = 0;                  // mid-epoch flash copies and the seconds they took
  double flash_secs_ = 0;
  ckpt::BackgroundPersister persister_;  // rank 0's disk checkpoints, off the training thread
};

}  // namespace dlaunch::train
