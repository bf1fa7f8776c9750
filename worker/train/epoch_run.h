// One epoch while the trainer trains it (trainer.cc): where it stands, its running totals, and
// where a step stands in it for the learning-rate schedule. Plain values, no I/O.
#pragma once

#include <chrono>
#include <cstdint>

#include "worker/train/checkpointing.h"
#include "worker/train/epoch_totals.h"

namespace dlaunch::train {

// One epoch while it trains (Trainer::train_epoch): where it stands and its running totals.
struct EpochRun {
  int64_t epoch = 0;        // 0-based
  int64_t steps = 0;        // this rank's steps in the whole epoch
  int64_t seen_before = 0;  // the epoch's samples trained before a re-form (0: none)
  double n_train = 0;       // the training set's size
  int64_t step = 0;         // steps done, counting those skipped on a resume
  double learning_rate = 0;
  // The epoch's totals on the host: the seed of the StepSums at the start (rank 0 carries a
  // resumed epoch's totals so far, already summed over the ranks that trained them), then what
  // was read from them at a checkpoint or at the end. The steps add to the StepSums, not here.
  EpochTotals totals;
  double resumed_images = 0;
  double images = 0;  // this rank's images trained in this epoch by this run (not resumed)
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point window_start = start;

  // Where step i of this epoch stands in it, for the learning-rate schedule.
  double fraction(int64_t i) const {
    if (seen_before == 0) return static_cast<double>(i) / static_cast<double>(steps);
    return (static_cast<double>(seen_before) + static_cast<double>(i) / static_cast<double>(steps) *
                                                   (n_train - static_cast<double>(seen_before))) /
           n_train;
  }
  bool complete() const { return step == steps; }
  // Where a checkpoint written now, inside the epoch, stands.
  CheckpointPosition position() const { return {epoch, step, seen_before, totals}; }
};

// An epoch's figures over every rank.
struct EpochFigures {
  double loss = 0;
  double accuracy = 0;
  double images_per_s = 0;
};

}  // namespace dlaunch::train
