#include <algorithm>
#include <cmath>

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

// Max pooling walks planes of (h, w, cblock) values: an image's block of cblock channels (one
// channel when cblock is 1), so the channel loop is innermost and contiguous in every layout.
namespace {

void check_pool(const PoolShape& s) {
  const ActShape& a = s.in;
  DL_CHECK(a.cblock >= 1 && a.c % a.cblock == 0) << "c=" << a.c << " cblock=" << a.cblock;
  DL_CHECK(s.kernel >= 1 && s.stride >= 1 && s.pad >= 0 && 2 * s.pad <= s.kernel &&
           s.h_out() >= 1 && s.w_out() >= 1)
      << "max pool kernel " << s.kernel << " stride " << s.stride << " pad " << s.pad << " on "
      << a.h << "x" << a.w;
}

// The input offset (within a plane, in pixels) of output (oy, ox)'s winner: the first maximum in
// row-major window order, padding excluded (PyTorch's rule), for channel j of the block.
inline int64_t window_winner(const PoolShape& s, const float* plane, int64_t cb, int64_t j,
                             int64_t oy, int64_t ox) {
  const int64_t y0 = std::max<int64_t>(oy * s.stride - s.pad, 0);
  const int64_t x0 = std::max<int64_t>(ox * s.stride - s.pad, 0);
  const int64_t y1 = std::min(oy * s.stride - s.pad + s.kernel, s.in.h);
  const int64_t x1 = std::min(ox * s.stride - s.pad + s.kernel, s.in.w);
  int64_t best = y0 * s.in.w + x0;
  float best_v = plane[best * cb + j];
  for (int64_t y = y0; y < y1; ++y)
    for (int64_t x = x0; x < x1; ++x) {
      const float v = plane[(y * s.in.w + x) * cb + j];
      if (v > best_v || std::isnan(v)) {  // NaN propagates, as in PyTorch
        best_v = v;
        best = y * s.in.w + x;
        if (std::isnan(v)) return best;
      }
    }
  return best;
}

}  // namespace

void max_pool_forward(const PoolShape& s, const float* x, float* y) {
  ScopedOpTimer timer("max_pool");
  check_pool(s);
  const int64_t cb = s.in.cblock, planes = s.in.n * (s.in.c / cb);
  const int64_t hw_in = s.in.hw(), ho = s.h_out(), wo = s.w_out();
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < planes; ++p) {
    const float* px = x + p * hw_in * cb;
    float* py = y + p * ho * wo * cb;
    for (int64_t oy = 0; oy < ho; ++oy)
      for (int64_t ox = 0; ox < wo; ++ox)
        for (int64_t j = 0; j < cb; ++j)
          py[(oy * wo + ox) * cb + j] = px[window_winner(s, px, cb, j, oy, ox) * cb + j];
  }
}

void max_pool_backward(const PoolShape& s, const float* x, const float* dy, float* dx) {
  ScopedOpTimer timer("max_pool_backward");
  check_pool(s);
  const int64_t cb = s.in.cblock, planes = s.in.n * (s.in.c / cb);
  const int64_t hw_in = s.in.hw(), ho = s.h_out(), wo = s.w_out();
  // A plane per thread: overlapping windows add into the same dx entries without races.
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < planes; ++p) {
    const float* px = x + p * hw_in * cb;
    const float* pdy = dy + p * ho * wo * cb;
    float* pdx = dx + p * hw_in * cb;
    std::fill(pdx, pdx + hw_in * cb, 0.0f);
    for (int64_t oy = 0; oy < ho; ++oy)
      for (int64_t ox = 0; ox < wo; ++ox)
        for (int64_t j = 0; j < cb; ++j)
          pdx[window_winner(s, px, cb, j, oy, ox) * cb + j] += pdy[(oy * wo + ox) * cb + j];
  }
}

}  // namespace dlaunch::kernels::cpu
