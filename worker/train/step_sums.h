// The training steps' figures, [loss * n, correct, n], summed where the steps run: in the
// backend's memory, for the current log window and for the epoch. The loss op adds each step's
// (softmax_cross_entropy_sums) without a read on the host; the trainer reads the sums at its log
// points, at flash and stop checkpoints and at the epoch's end. On a GPU those reads are the
// only waits for the device the figures cost: no step waits for its own loss. The sums are the
// same bits as adding the steps' results up on the host (kernels/cross_entropy.h).
//
// Blocking: begin_epoch and the reads are one small copy each (a read waits for the queued
// steps). Errors: the backend's. Not thread-safe (the training thread's).
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/backend.h"
#include "worker/train/epoch_totals.h"

namespace dlaunch::train {

class StepSums {
 public:
  // Triples at sums(): the window's, then the epoch's.
  static constexpr int64_t kTriples = 2;

  explicit StepSums(kernels::Backend& backend);
  ~StepSums();
  StepSums(const StepSums&) = delete;
  StepSums& operator=(const StepSums&) = delete;

  // A new epoch: the window empty, the epoch's sums `totals` (a resumed epoch's so far, or zeros).
  void begin_epoch(const EpochTotals& totals);
  // Where the loss op adds a step's figures: kTriples triples in the backend's memory.
  double* sums() { return sums_; }
  // The window's sums, read to the host (nothing changes: the caller sums them over the ranks,
  // then clear_window(), so a collective that fails loses nothing).
  EpochTotals read_window();
  void clear_window();
  // All the sums as they are now, and back to them: a training step interrupted by a peer's
  // death is rolled back before it is run again (rank-level recovery). One small copy each.
  struct Saved {
    double sums[6];
  };
  Saved save() const;
  void restore(const Saved& saved);
  // The epoch's sums so far, read to the host.
  EpochTotals read_totals();
  // The window's mean loss so far when reading it costs nothing (the backend's memory is the
  // host's) and the window has a step; nullopt otherwise (the caller keeps what its last
  // window read gave).
  std::optional<double> free_window_loss() const;

 private:
  kernels::Backend& backend_;
  double* sums_ = nullptr;  // [window: loss * n, correct, n; epoch: the same]
};

}  // namespace dlaunch::train
