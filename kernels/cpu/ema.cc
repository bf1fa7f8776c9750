// The weights' exponential moving average on the CPU (kernels/ema_update.h).
#include "kernels/ema_update.h"
#include "kernels/ops.h"

namespace dlaunch::kernels::cpu {

void ema_update(int64_t n, float decay, const float* x, float* avg) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) ema_update_element(avg[i], x[i], decay);
}

}  // namespace dlaunch::kernels::cpu
