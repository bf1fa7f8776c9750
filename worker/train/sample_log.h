// Test-only: DTRAIN_LOG_SAMPLES=DIR makes each dtrain process append the sample indices of every
// training step it completed to DIR/samples.<pid>, so that a test can count how often each
// sample of an epoch was trained across deaths, replacements and shrinks (docs/dtrain.md,
// "Environment knobs for tests"). Off (no file, no cost) when the variable is unset or empty.
//
// One line per step, written and flushed when the step's optimizer step ran (a process
// SIGKILLed later keeps it): "<epoch> <global step> <world size> <index> <index> ...".
// Errors: SystemError when DIR/samples.<pid> cannot be opened or written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace dlaunch::train {

class SampleLog {
 public:
  // Reads DTRAIN_LOG_SAMPLES.
  static SampleLog from_env();

  bool on() const { return file_ != nullptr; }
  // Epoch `epoch` (0-based) step `global_step` trained `indices[first, first + count)`.
  void record(int64_t epoch, int64_t global_step, int world_size,
              const std::vector<int64_t>& indices, size_t first, size_t count);

 private:
  std::shared_ptr<std::FILE> file_;
  std::string path_;
};

}  // namespace dlaunch::train
