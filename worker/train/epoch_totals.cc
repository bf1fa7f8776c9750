#include "worker/train/epoch_totals.h"

namespace dlaunch::train {

nlohmann::json EpochTotals::to_json() const {
  return {loss_sum, correct, samples};
}

EpochTotals EpochTotals::from_json(const nlohmann::json& recorded) {
  double values[3] = {0, 0, 0};
  if (recorded.is_array()) {
    for (size_t k = 0; k < 3 && k < recorded.size(); ++k) values[k] = recorded[k].get<double>();
  }
  return {values[0], values[1], values[2]};
}

EpochTotals sum_over_ranks(comm::ProcessGroup& pg, const EpochTotals& mine) {
  double sums[3] = {mine.loss_sum, mine.correct, mine.samples};
  pg.allreduce(sums, 3, comm::ReduceOp::kSum);
  return {sums[0], sums[1], sums[2]};
}

TotalsAndWeights sum_over_ranks(comm::ProcessGroup& pg, const EpochTotals& mine,
                                double non_finite_weights) {
  double sums[4] = {mine.loss_sum, mine.correct, mine.samples, non_finite_weights};
  pg.allreduce(sums, 4, comm::ReduceOp::kSum);
  return {{sums[0], sums[1], sums[2]}, sums[3]};
}

}  // namespace dlaunch::train
