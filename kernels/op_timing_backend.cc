#include "kernels/op_timing_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace dlaunch::kernels {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The op the trainer calls once per training step (see the header).
constexpr const char* kStepOp = "softmax_cross_entropy_sums";
// The op that returns its result on the host (a wait for the device on a GPU).
constexpr const char* kHostResultOp = "softmax_cross_entropy";

}  // namespace

OpTimingBackend::OpTimingBackend(Backend& inner, int64_t skip_steps)
    : inner_(inner), skip_steps_(std::max<int64_t>(0, skip_steps)) {}

void* OpTimingBackend::alloc(size_t bytes) {
  if (steps_seen_ > skip_steps_) {
    ++allocations_;
    allocated_bytes_ += static_cast<int64_t>(bytes);
  }
  return inner_.alloc(bytes);
}

void OpTimingBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (steps_seen_ > skip_steps_) ++host_reads_;
  inner_.copy_to_host(dst, src, bytes);
}

void OpTimingBackend::free(void* p) noexcept {
  if (p != nullptr && steps_seen_ > skip_steps_) ++frees_;
  inner_.free(p);
}

OpTimingBackend::Timed::Timed(OpTimingBackend& owner, const char* op)
    : owner_(owner), op_(op), counted_(false) {
  if (std::strcmp(op, kStepOp) == 0) ++owner_.steps_seen_;
  counted_ = owner_.steps_seen_ > owner_.skip_steps_;
  if (counted_ && std::strcmp(op, kHostResultOp) == 0) ++owner_.host_reads_;
  if (!counted_) return;
  owner_.inner_.synchronize();
  start_ns_ = now_ns();
}

OpTimingBackend::Timed::~Timed() {
  if (!counted_) return;
  // An op that threw leaves the device as it is; its partial time is still added.
  try {
    owner_.inner_.synchronize();
  } catch (...) {
  }
  Total& t = owner_.totals_[op_];
  ++t.calls;
  t.seconds += 1e-9 * static_cast<double>(now_ns() - start_ns_);
}

std::string OpTimingBackend::report() const {
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double sum = 0;
  for (const auto& r : rows) sum += r.second.seconds;
  std::string out = fmt::format("op times on {}, each op synchronised, {} training step(s) after {} skipped\n",
                                inner_.name(), steps_counted(), skip_steps_);
  out += fmt::format("{:<28} {:>7} {:>10} {:>10} {:>7}\n", "op", "calls", "total_ms", "ms/step", "share");
  const double steps = static_cast<double>(std::max<int64_t>(1, steps_counted()));
  for (const auto& [op, t] : rows) {
    out += fmt::format("{:<28} {:>7} {:>10.2f} {:>10.3f} {:>6.1f}%\n", op, t.calls, t.seconds * 1e3,
                       t.seconds * 1e3 / steps, sum > 0 ? 100 * t.seconds / sum : 0.0);
  }
  out += fmt::format("{:<28} {:>7} {:>10.2f} {:>10.3f}\n", "all ops", "", sum * 1e3, sum * 1e3 / steps);
  out += fmt::format("device allocations after the warm-up: {} ({} bytes), frees: {}\n", allocations_,
                     allocated_bytes_, frees_);
  out += fmt::format("host reads after the warm-up: {} (copies to the host and ops returning a host value)\n",
                     host_reads_);
  return out;
}

}  // namespace dlaunch::kernels
