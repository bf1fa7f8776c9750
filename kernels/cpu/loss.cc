#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "kernels/ops.h"

namespace dlaunch::kernels::cpu {

float softmax_cross_entropy(int64_t n, int64_t classes, const float* logits,
                            const int32_t* labels, float* dlogits, int64_t* correct) {
  DL_CHECK(n > 0 && classes > 0) << "n=" << n << " classes=" << classes;
  double total = 0;
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits + i * classes;
    const int32_t label = labels[i];
    DL_CHECK(label >= 0 && label < classes) << "label " << label << " of row " << i
                                            << " outside [0, " << classes << ")";
    const int64_t arg = std::max_element(row, row + classes) - row;
    if (arg == label) ++hits;
    // log-sum-exp around the max keeps exp() in range.
    const double mx = row[arg];
    double z = 0;
    for (int64_t j = 0; j < classes; ++j) z += std::exp(static_cast<double>(row[j]) - mx);
    const double lse = mx + std::log(z);
    total += lse - row[label];
    if (dlogits) {
      float* g = dlogits + i * classes;
      for (int64_t j = 0; j < classes; ++j) {
        const double p = std::exp(static_cast<double>(row[j]) - lse);
        g[j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) / static_cast<double>(n));
      }
    }
  }
  if (correct) *correct = hits;
  return static_cast<float>(total / static_cast<double>(n));
}

}  // namespace dlaunch::kernels::cpu
