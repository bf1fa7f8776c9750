#include <cstring>

#include "common/error.h"
#include "kernels/ops.h"
#include "kernels/profile.h"

namespace dlaunch::kernels::cpu {

void reorder(const ActShape& s, const float* src, int dst_cblock, float* dst) {
  ScopedOpTimer timer("reorder");
  const int sb = s.cblock, db = dst_cblock;
  DL_CHECK(s.c % sb == 0 && s.c % db == 0) << "c=" << s.c << " src block=" << sb << " dst block=" << db;
  const int64_t hw = s.hw();
  if (sb == db) {
    std::memcpy(dst, src, sizeof(float) * s.numel());
    return;
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t c = 0; c < s.c; ++c) {
      const float* in = src + ((n * (s.c / sb) + c / sb) * hw) * sb + c % sb;
      float* out = dst + ((n * (s.c / db) + c / db) * hw) * db + c % db;
      for (int64_t i = 0; i < hw; ++i) out[i * db] = in[i * sb];
    }
  }
}

}  // namespace dlaunch::kernels::cpu
