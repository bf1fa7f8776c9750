#include "common/error.h"
#include "kernels/ops.h"
#include "kernels/profile.h"

namespace dlaunch::kernels::cpu {

void global_avg_pool_forward(const ActShape& s, const float* x, float* y) {
  ScopedOpTimer timer("avg_pool");
  DL_CHECK(s.cblock >= 1 && s.c % s.cblock == 0) << "c=" << s.c << " cblock=" << s.cblock;
  const int64_t cb = s.cblock, blocks = s.c / cb, hw = s.hw();
  const float inv = 1.0f / static_cast<float>(hw);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < s.n * blocks; ++p) {
    const int64_t n = p / blocks, c0 = (p % blocks) * cb;
    const float* px = x + p * hw * cb;
    for (int64_t j = 0; j < cb; ++j) {
      float acc = 0;
      for (int64_t i = 0; i < hw; ++i) acc += px[i * cb + j];
      y[n * s.c + c0 + j] = acc * inv;
    }
  }
}

void global_avg_pool_backward(const ActShape& s, const float* dy, float* dx) {
  ScopedOpTimer timer("avg_pool_backward");
  DL_CHECK(s.cblock >= 1 && s.c % s.cblock == 0) << "c=" << s.c << " cblock=" << s.cblock;
  const int64_t cb = s.cblock, blocks = s.c / cb, hw = s.hw();
  const float inv = 1.0f / static_cast<float>(hw);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < s.n * blocks; ++p) {
    const int64_t n = p / blocks, c0 = (p % blocks) * cb;
    float* px = dx + p * hw * cb;
    for (int64_t i = 0; i < hw; ++i)
      for (int64_t j = 0; j < cb; ++j) px[i * cb + j] = dy[n * s.c + c0 + j] * inv;
  }
}

}  // namespace dlaunch::kernels::cpu
