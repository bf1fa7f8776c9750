#include "worker/train/step_sums.h"

namespace dlaunch::train {

namespace {

constexpr size_t kTripleBytes = 3 * sizeof(double);

EpochTotals triple(const double (&sums)[3]) { return {sums[0], sums[1], sums[2]}; }

}  // namespace

StepSums::StepSums(kernels::Backend& backend)
    : backend_(backend),
      sums_(static_cast<double*>(backend.alloc(static_cast<size_t>(kTriples) * kTripleBytes))) {}

StepSums::~StepSums() { backend_.free(sums_); }

void StepSums::begin_epoch(const EpochTotals& totals) {
  const double start[6] = {0, 0, 0, totals.loss_sum, totals.correct, totals.samples};
  backend_.copy_from_host(sums_, start, sizeof(start));
}

EpochTotals StepSums::read_window() {
  double window[3];
  backend_.copy_to_host(window, sums_, kTripleBytes);
  return triple(window);
}

void StepSums::clear_window() { backend_.zero(sums_, kTripleBytes); }

StepSums::Saved StepSums::save() const {
  Saved saved;
  backend_.copy_to_host(saved.sums, sums_, sizeof saved.sums);
  return saved;
}

void StepSums::restore(const Saved& saved) {
  backend_.copy_from_host(sums_, saved.sums, sizeof saved.sums);
}

EpochTotals StepSums::read_totals() {
  double totals[3];
  backend_.copy_to_host(totals, sums_ + 3, kTripleBytes);
  return triple(totals);
}

std::optional<double> StepSums::free_window_loss() const {
  if (!backend_.host_accessible() || !(sums_[2] > 0)) return std::nullopt;
  return sums_[0] / sums_[2];
}

}  // namespace dlaunch::train
