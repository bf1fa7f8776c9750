// Where a run starts: afresh, from a checkpoint (on disk, or the flash copy a restarted worker's
// predecessor left), or, for a replacement rank, from the state of a rank that survived, as one
// ResumePoint value the training loop consumes once.
//
//   a replacement (DLAUNCH_REPLACEMENT=1): the state of the lowest rank holding it, by broadcast
//               (peer_state.h); when no rank holds it (every rank is new), the sources below
//   rank 0:     choose (--resume none|auto|PATH, --overwrite, the flash copy) -> check that this
//               run can continue it -> read it
//   every rank: the decision by broadcast (a refusal throws the same error on every rank instead
//               of leaving the others in a collective) -> the model's parameters and buffers,
//               the optimizer's state and fp16's loss scale from rank 0's arrays (one broadcast)
//               -> the position the run goes on from
//
// resume() blocks for the reads and the broadcasts and throws UsageError (a checkpoint of other
// settings, an --output_dir holding other runs' checkpoints), ckpt::CheckpointError (nothing
// valid to resume, a corrupt --resume PATH), PeerStateError (a replacement that could not take
// a live peer's state: the source died, the checksum did not match) or the group's errors.
// resume_point_of, checkpoint_to_resume and require_one_run are pure.
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "worker/checkpoint/checkpoint.h"
#include "worker/comm/process_group.h"
#include "worker/data/dataset.h"
#include "worker/ddp/data_parallel.h"
#include "worker/model/resnet.h"
#include "worker/optim/optimizer.h"
#include "worker/train/epoch_totals.h"
#include "worker/train/peer_state.h"
#include "worker/train/precision.h"
#include "worker/train/train_config.h"

namespace dlaunch::train {

// Where an epoch that a stop cut short goes on (all zero: it starts at its beginning).
struct EpochResume {
  // The same world and batch size: the epoch's steps already done, skipped.
  int64_t skip_steps = 0;
  // Another world or batch size, or an epoch that began after such a change: how many entries of
  // the epoch's permutation were trained (a prefix, distributed_sampler.h).
  int64_t seen = 0;
  // The epoch's totals so far, already summed over the ranks that trained them.
  EpochTotals totals;
};

struct ResumePoint {
  bool resumed = false;
  std::string checkpoint;   // the file resumed from
  std::string run_id;       // this run's id (the checkpoint's, or a new one), on every rank
  int64_t epochs_done = 0;  // the epoch to start with (0-based)
  int64_t global_step = 0;
  double test_loss = std::nan("");  // the checkpoint's last evaluation (NaN: none)
  double test_accuracy = std::nan("");
  int64_t saved_world_size = 0;  // the world that wrote the checkpoint, and its ranks' batch
  int64_t saved_batch_size = 0;
  int64_t saved_global_batch = 0;  // --elastic_batch global's kept global batch (0: none)
  EpochResume inside_epoch;  // a checkpoint written inside epoch epochs_done + 1
  std::vector<float> ema;    // the checkpoint's EMA when this run keeps one (--ema)
};

// What a resume restores of the trainer's objects.
struct ResumeTargets {
  model::ResNet& model;
  ddp::DataParallel& data_parallel;  // a fresh start broadcasts rank 0's initial state
  optim::Optimizer& optimizer;
  MixedPrecision& precision;
};

// Every rank, collectively. `flash_dir`: this rank's flash copies ("" when none); rank 0 reads
// its node's when resuming. `replacement`: this process replaces a failed rank of a running job
// (WorkerEnv::replacement); every rank of the group must then take part in resume_from_peer
// first: the new ones through this call, the survivors by offering their state
// (share_peer_state with has_state, encode_training_state).
ResumePoint resume(const TrainConfig& config, comm::ProcessGroup& pg,
                   const data::ImageDataset& train_set, const ResumeTargets& targets,
                   const std::string& flash_dir, bool replacement = false);

// Every rank without state, collectively with the survivors: the state of the lowest rank that
// holds it (peer_state.h), checked as a checkpoint would be and loaded into `targets`, and the
// position it records. nullopt when no rank holds it (nothing loaded). Throws PeerStateError
// when the exchange failed (nothing loaded, unless another rank failed after this one loaded a
// whole state), UsageError never: a state of other settings is a failed exchange too.
std::optional<ResumePoint> resume_from_peer(const TrainConfig& config, comm::ProcessGroup& pg,
                                            const data::ImageDataset& train_set,
                                            const ResumeTargets& targets);

// A survivor of a peer's death (train/rank_recovery.h), collectively with the replacement(s) and
// the other survivors once the group re-formed: offers its state at `version` (its global step;
// `serialize` encodes it) to the ranks without it and, when another survivor holds a newer one
// (it completed a step this rank did not), loads that into `targets` and sets `*received` to its
// position (also when the exchange then failed on another rank: the state loaded is whole).
// Returns the exchange's result (peer_state.h); never throws for a failed exchange.
PeerStateResult exchange_state_as_survivor(const TrainConfig& config, comm::ProcessGroup& pg,
                                           const data::ImageDataset& train_set,
                                           const ResumeTargets& targets, int64_t version,
                                           const SerializeState& serialize,
                                           std::optional<ResumePoint>* received);

// The position a checkpoint's `meta` records, for a run of `world_size` ranks with --batch_size
// `batch_size` over `train_size` samples (the EMA, the file and the run id are not its part).
ResumePoint resume_point_of(const nlohmann::json& meta, int64_t world_size, int64_t batch_size,
                            int64_t train_size);

// The disk checkpoint --resume (`resume`: none, auto or a path) asks for among --output_dir's
// files (scan_checkpoints: newest first); "" for a fresh start. Refuses (UsageError) --resume
// none among checkpoints and --resume auto among several runs' valid ones, and (CheckpointError)
// --resume auto among corrupt ones only; logs a warning for each corrupt file it skips.
std::string checkpoint_to_resume(const std::string& resume, const std::string& output_dir,
                                 const std::vector<ckpt::CheckpointFile>& files);

// --resume PATH continuing run `run_id`: refuses (UsageError) an --output_dir holding valid
// checkpoints of another run, which the two runs would prune for each other.
void require_one_run(const std::string& path, const std::string& run_id,
                     const std::string& output_dir, const std::vector<ckpt::CheckpointFile>& files);

}  // namespace dlaunch::train
