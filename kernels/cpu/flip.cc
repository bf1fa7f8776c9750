// The left-right flip of flip test-time augmentation on the CPU (kernels/flip_index.h).
#include "common/error.h"
#include "kernels/flip_index.h"
#include "kernels/ops.h"

namespace dlaunch::kernels::cpu {

void flip_horizontal(const ActShape& s, const float* x, float* y) {
  DL_CHECK(x != y) << "flip_horizontal: y must not alias x";
  const int64_t n = s.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[mirrored_index(i, s.w, s.cblock)];
}

}  // namespace dlaunch::kernels::cpu
