// kernels::OpTimingBackend: a Backend that forwards every call to another one and measures how
// long each op takes on the device, for "where does a step's time go" on a GPU without a
// profiler installed (DTRAIN_PROFILE_OPS, docs/dtrain.md; bench/gpu/gpu_bench.py's profile).
//
// A GPU backend returns from an op before its kernels ran, so host timers around the call measure
// launches. Here each op waits for the work queued before it (synchronize()), runs, and waits for
// itself: the time between is the op's device time plus one launch and one synchronisation. That
// serialises the step (no overlap of copies, collectives and compute), so the totals add up to
// more than a normal step: read the shares, not the sum. On the CPU the waits are free and the
// figures are the ops' wall times.
//
// Steps: the trainer calls its loss op (softmax_cross_entropy_sums) once per training step
// (between forward and backward), so its calls mark the steps: counting starts at call
// skip_steps + 1 (cuDNN's autotuning and plan building happen in the first calls of each shape),
// and each counted "step" runs from one loss op to the next, every op of a training step once.
// Evaluation's batches (softmax_cross_entropy) are not steps, but their ops fall into the step
// they follow: profile a run whose test split is small (DTRAIN_LIMIT_TEST_SAMPLES=1, as
// bench/gpu/gpu_bench.py does). Allocations, frees and host reads after the warm-up are counted
// too, and reported under the table.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "kernels/backend.h"

namespace dlaunch::kernels {

class OpTimingBackend final : public Backend {
 public:
  OpTimingBackend(Backend& inner, int64_t skip_steps);

  // One line per op, slowest first: "op calls total_ms share%" (profile.h's format), after a
  // header naming the device and the steps counted.
  std::string report() const;
  int64_t steps_counted() const { return steps_seen_ > skip_steps_ ? steps_seen_ - skip_steps_ : 0; }
  // Device memory allocated and freed after the warm-up (calls, bytes): what "steady-state steps
  // allocate nothing" is checked against (the model, its gradients and the optimizer keep their
  // buffers from step to step; a new allocation per step would cost a cudaMalloc and its sync).
  int64_t allocations() const { return allocations_; }
  int64_t allocated_bytes() const { return allocated_bytes_; }
  int64_t frees() const { return frees_; }
  // Reads of device results on the host after the warm-up (copy_to_host calls and calls of
  // softmax_cross_entropy, which returns its loss): each waits for the device on a GPU. The
  // training step itself reads nothing (softmax_cross_entropy_sums); the trainer reads its
  // figures at its log points.
  int64_t host_reads() const { return host_reads_; }

  std::string name() const override { return inner_.name(); }
  bool host_accessible() const override { return inner_.host_accessible(); }
  void* alloc(size_t bytes) override;
  void free(void* p) noexcept override;
  void zero(void* p, size_t bytes) override { inner_.zero(p, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { inner_.copy_from_host(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void stage_to_device(void* dst, const void* src, size_t bytes) override { inner_.stage_to_device(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { inner_.copy(dst, src, bytes); }
  void synchronize() override { inner_.synchronize(); }
  int preferred_cblock(int64_t c) const override { return inner_.preferred_cblock(c); }
  ConvAutotuneStats conv_autotune_stats() const override { return inner_.conv_autotune_stats(); }

#define DL_OP(ret, name, params, args) \
  ret name params override {           \
    const Timed timed(*this, #name);   \
    return inner_.name args;           \
  }
#include "kernels/op_signatures.inc"
#undef DL_OP

 private:
  // Waits for the device, notes the time; the destructor waits again and adds the op's time.
  class Timed {
   public:
    Timed(OpTimingBackend& owner, const char* op);
    ~Timed();
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    OpTimingBackend& owner_;
    const char* op_;
    bool counted_;
    int64_t start_ns_ = 0;
  };

  struct Total {
    int64_t calls = 0;
    double seconds = 0;
  };

  Backend& inner_;
  int64_t skip_steps_;
  int64_t steps_seen_ = 0;
  int64_t allocations_ = 0, allocated_bytes_ = 0, frees_ = 0, host_reads_ = 0;
  std::map<std::string, Total> totals_;
};

}  // namespace dlaunch::kernels
