// Test-only fault injection: dtrain's ranks kill (or stop) themselves at chosen steps, so that
// tests and benchmarks can fail a worker at a known point of the training (docs/dtrain.md,
// "Environment knobs for tests").
#pragma once

#include <csignal>
#include <cstdint>
#include <string>
#include <vector>

namespace dlaunch::train {

// Test-only fault injection, read from the environment by dtrain's main: on the first attempt
// (TORCHELASTIC_RESTART_COUNT=0) rank `points[i].rank` raises `signal` right after global step
// `points[i].step`: SIGKILL (dies) or SIGSTOP (hangs, for --collective_timeout). Empty: off.
// Several points are several deaths in one run: a rank replaced in process keeps the attempt, so
// its replacement meets the points after the step it starts from.
// `after_optimizer`: at that step's optimizer step instead, before the stop-signal agreement
// (the peers then fail after the step is complete: rank-level recovery does not redo it).
struct FaultPoint {
  int64_t step = -1;
  int64_t rank = 0;
};
struct FaultInjection {
  std::vector<FaultPoint> points;
  int signal = SIGKILL;
  bool after_optimizer = false;
  // This rank (not a replacement) SIGSTOPs itself when it begins its first re-form after a
  // peer's failure: a survivor that hangs while the group recovers. -1: off.
  int64_t stall_in_reform_rank = -1;

  bool fires(int64_t step, int64_t rank) const {
    for (const FaultPoint& p : points) {
      if (p.step == step && p.rank == rank) return true;
    }
    return false;
  }
};

// DTRAIN_FAIL_AT_STEP's steps ("N" or "N1,N2,..."; a negative one is none, so -1 is off) and
// DTRAIN_FAIL_RANK's ranks (one for every step, or one per step; `default_rank` when unset).
// UsageError for anything else.
std::vector<FaultPoint> parse_fault_points(const std::string& steps, const std::string& ranks,
                                           int64_t default_rank);

}  // namespace dlaunch::train
