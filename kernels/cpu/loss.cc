#include "common/error.h"
#include "kernels/cross_entropy.h"
#include "kernels/ops.h"

namespace dlaunch::kernels::cpu {
namespace {

struct RowTotals {
  double loss = 0;   // the rows' losses summed in row order
  int64_t hits = 0;  // rows whose argmax is the label
};

// Every row's loss and hit, and its gradient when dlogits is not null.
RowTotals cross_entropy_rows(int64_t n, int64_t classes, const float* logits,
                             const int32_t* labels, float* dlogits, float label_smoothing) {
  DL_CHECK(n > 0 && classes > 0) << "n=" << n << " classes=" << classes;
  RowTotals t;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t label = labels[i];
    DL_CHECK(label >= 0 && label < classes)
        << "label " << label << " of row " << i << " outside [0, " << classes << ")";
    const CrossEntropyRow row =
        cross_entropy_row(classes, logits + i * classes, label, label_smoothing,
                          static_cast<double>(n), dlogits ? dlogits + i * classes : nullptr);
    t.loss += row.loss;
    t.hits += row.hit;
  }
  return t;
}

}  // namespace

float softmax_cross_entropy(int64_t n, int64_t classes, const float* logits, const int32_t* labels,
                            float* dlogits, int64_t* correct, float label_smoothing) {
  const RowTotals t = cross_entropy_rows(n, classes, logits, labels, dlogits, label_smoothing);
  if (correct) *correct = t.hits;
  return static_cast<float>(t.loss / static_cast<double>(n));
}

void softmax_cross_entropy_sums(int64_t n, int64_t classes, const float* logits,
                                const int32_t* labels, float* dlogits, float label_smoothing,
                                double* sums, int64_t k) {
  DL_CHECK(k >= 0 && (k == 0 || sums != nullptr)) << "k=" << k;
  const RowTotals t = cross_entropy_rows(n, classes, logits, labels, dlogits, label_smoothing);
  add_step_sums(t.loss, t.hits, n, sums, k);
}

}  // namespace dlaunch::kernels::cpu
