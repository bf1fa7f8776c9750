// An epoch's training figures summed over its samples: what the loss op adds per step
// (kernels' softmax_cross_entropy_sums, through StepSums), what a checkpoint written inside an
// epoch records, and what the epoch line reports once summed over the ranks. The same sums
// serve a log window and an evaluation.
//
// sum_over_ranks is one blocking all-reduce on the group (its timeouts and errors); the rest is
// plain arithmetic.
#pragma once

#include <nlohmann/json.hpp>

#include "worker/comm/process_group.h"

namespace dlaunch::train {

struct EpochTotals {
  double loss_sum = 0;  // the loss times the samples
  double correct = 0;   // samples predicted right
  double samples = 0;

  double mean_loss() const { return loss_sum / samples; }
  double accuracy() const { return correct / samples; }
  // As a checkpoint records them ("epoch_totals"): [loss_sum, correct, samples].
  nlohmann::json to_json() const;
  // The inverse of to_json(); entries missing from a short or absent array read as 0.
  static EpochTotals from_json(const nlohmann::json& recorded);
};

// Every rank's `mine` summed, in one all-reduce of three numbers.
EpochTotals sum_over_ranks(comm::ProcessGroup& pg, const EpochTotals& mine);

// The totals summed with each rank's count of inf/NaN weights riding along in the same
// all-reduce (four numbers), so the divergence check costs no collective of its own.
struct TotalsAndWeights {
  EpochTotals totals;
  double non_finite_weights = 0;
};
TotalsAndWeights sum_over_ranks(comm::ProcessGroup& pg, const EpochTotals& mine,
                                double non_finite_weights);

}  // namespace dlaunch::train
