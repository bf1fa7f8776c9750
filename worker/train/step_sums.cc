#include "worker/train/step_sums.h"

namespace dlaunch::train {

namespace {
constexpr size_t kTripleBytes = 3 * sizeof(double);
}  // namespace

StepSums::StepSums(kernels::Backend& backend)
    : backend_(backend),
      sums_(static_cast<double*>(backend.alloc(static_cast<size_t>(kTriples) * kTripleBytes))) {}

StepSums::~StepSums() { backend_.free(sums_); }

void StepSums::begin_epoch(const double totals[3]) {
  const double start[6] = {0, 0, 0, totals[0], totals[1], totals[2]};
  backend_.copy_from_host(sums_, start, sizeof(start));
}

void StepSums::take_window(double out[3]) {
  backend_.copy_to_host(out, sums_, kTripleBytes);
  backend_.zero(sums_, kTripleBytes);
}

void StepSums::read_totals(double out[3]) { backend_.copy_to_host(out, sums_ + 3, kTripleBytes); }

std::optional<double> StepSums::free_window_loss() const {
  if (!backend_.host_accessible() || !(sums_[2] > 0)) return std::nullopt;
  return sums_[0] / sums_[2];
}

}  // namespace dlaunch::train
