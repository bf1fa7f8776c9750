// Whether training diverged: the training loss or the weights became infinite or NaN. Every
// rank checks the same all-reduced figures at the same points (a log window, a flash copy, an
// epoch's end), so all of them stop at the same step; a check runs before every checkpoint, so
// none holds a diverged state. Pure: no I/O, no collective.
#pragma once

#include <cstdint>
#include <optional>

#include "common/error.h"
#include "worker/train/train_config.h"

namespace dlaunch::train {

// Training diverged: the training loss (fp32, bf16) or the weights (any precision) became
// infinite or NaN. Thrown on every rank alike, before any checkpoint of that state is written.
class DivergedError : public Error {
 public:
  using Error::Error;
};

class DivergenceCheck {
 public:
  // Training goes on from `global_step` (0, or a resumed checkpoint's): the last finite state.
  // `config` names the flags to change in the message. `check_loss` is false where a loss
  // scaler skips the steps of an inf/NaN loss (fp16), so only the weights can diverge.
  DivergenceCheck(const TrainConfig& config, bool check_loss, int64_t global_step);

  // After `global_step`: `loss_sum` the summed training loss of the steps since the last check,
  // `bad_weights` the count of inf/NaN weights (nullopt: not counted here), both summed over
  // the ranks. Throws DivergedError naming the steps since the last check that passed.
  void check(int64_t global_step, std::optional<double> loss_sum,
             std::optional<double> bad_weights);

 private:
  const TrainConfig& config_;
  bool check_loss_;
  // The global steps after which the loss and the weights were last found finite.
  int64_t loss_finite_at_ = 0, weights_finite_at_ = 0;
};

}  // namespace dlaunch::train
