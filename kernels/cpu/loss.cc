#include "common/error.h"
#include "kernels/cross_entropy.h"
#include "kernels/ops.h"

namespace dlaunch::kernels::cpu {

float softmax_cross_entropy(int64_t n, int64_t classes, const float* logits, const int32_t* labels,
                            float* dlogits, int64_t* correct, float label_smoothing) {
  DL_CHECK(n > 0 && classes > 0) << "n=" << n << " classes=" << classes;
  double total = 0;
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t label = labels[i];
    DL_CHECK(label >= 0 && label < classes)
        << "label " << label << " of row " << i << " outside [0, " << classes << ")";
    const CrossEntropyRow row =
        cross_entropy_row(classes, logits + i * classes, label, label_smoothing,
                          static_cast<double>(n), dlogits ? dlogits + i * classes : nullptr);
    total += row.loss;
    hits += row.hit;
  }
  if (correct) *correct = hits;
  return static_cast<float>(total / static_cast<double>(n));
}

}  // namespace dlaunch::kernels::cpu
