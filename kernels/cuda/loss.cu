#include <vector>

#include "kernels/cross_entropy.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace dlaunch::kernels::cuda {
namespace {

// A thread per row (grid-stride; classes are few): loss and hit per row, gradient when asked, the
// label smoothing term included (kernels/cross_entropy.h, the CPU op's math).
__global__ void ce_kernel(int64_t n, int64_t k, const float* logits, const int32_t* labels,
                          float eps, float* dlogits, double* row_loss, int* row_hit) {
  DL_GRID_LOOP(i, n) {
    const CrossEntropyRow row = cross_entropy_row(k, logits + i * k, labels[i], eps, double(n),
                                                  dlogits ? dlogits + i * k : nullptr);
    row_loss[i] = row.loss;
    row_hit[i] = row.hit;
  }
}

struct RowBuffers {
  double* loss;  // per row, on the device
  int* hit;
};

// Checks the labels, puts them on the device (staged: no wait for the queued work) and runs the
// per-row kernel into the workspace, which holds the labels and the rows' figures.
RowBuffers cross_entropy_rows(int64_t n, int64_t classes, const float* logits,
                              const int32_t* labels, float* dlogits, float label_smoothing) {
  DL_CHECK(n > 0 && classes > 0) << "n=" << n << " classes=" << classes;
  for (int64_t i = 0; i < n; ++i)
    DL_CHECK(labels[i] >= 0 && labels[i] < classes)
        << "label " << labels[i] << " of row " << i << " outside [0, " << classes << ")";
  const size_t label_bytes = (sizeof(int32_t) * n + 7) / 8 * 8;
  char* ws =
      static_cast<char*>(detail::workspace(label_bytes + (sizeof(double) + sizeof(int)) * n));
  int32_t* d_labels = reinterpret_cast<int32_t*>(ws);
  RowBuffers rows{reinterpret_cast<double*>(ws + label_bytes),
                  reinterpret_cast<int*>(ws + label_bytes + sizeof(double) * n)};
  stage_to_device(d_labels, labels, sizeof(int32_t) * n);
  ce_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, classes, logits, d_labels,
                                                         label_smoothing, dlogits, rows.loss,
                                                         rows.hit);
  DL_CUDA_LAUNCH_CHECK();
  return rows;
}

// One thread adds the rows up in row order, as the CPU op does, so the sums are the same bits.
// A batch is a few hundred rows: a reduction tree would save microseconds and change the bits.
__global__ void step_sums_kernel(int64_t n, const double* row_loss, const int* row_hit,
                                 double* sums, int64_t k) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double total = 0;
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) total += row_loss[i], hits += row_hit[i];
  add_step_sums(total, hits, n, sums, k);
}

}  // namespace

float softmax_cross_entropy(int64_t n, int64_t classes, const float* logits, const int32_t* labels,
                            float* dlogits, int64_t* correct, float label_smoothing) {
  const RowBuffers rows =
      cross_entropy_rows(n, classes, logits, labels, dlogits, label_smoothing);
  std::vector<double> loss(static_cast<size_t>(n));
  std::vector<int> hit(static_cast<size_t>(n));
  DL_CUDA_CHECK(cudaMemcpy(loss.data(), rows.loss, sizeof(double) * n, cudaMemcpyDeviceToHost));
  DL_CUDA_CHECK(cudaMemcpy(hit.data(), rows.hit, sizeof(int) * n, cudaMemcpyDeviceToHost));
  double total = 0;
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) total += loss[i], hits += hit[i];
  if (correct) *correct = hits;
  return float(total / double(n));
}

void softmax_cross_entropy_sums(int64_t n, int64_t classes, const float* logits,
                                const int32_t* labels, float* dlogits, float label_smoothing,
                                double* sums, int64_t k) {
  DL_CHECK(k >= 0 && (k == 0 || sums != nullptr)) << "k=" << k;
  const RowBuffers rows =
      cross_entropy_rows(n, classes, logits, labels, dlogits, label_smoothing);
  step_sums_kernel<<<1, 1>>>(n, rows.loss, rows.hit, sums, k);
  DL_CUDA_LAUNCH_CHECK();
}

}  // namespace dlaunch::kernels::cuda
