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

}  // namespace

float softmax_cross_entropy(int64_t n, int64_t classes, const float* logits, const int32_t* labels,
                            float* dlogits, int64_t* correct, float label_smoothing) {
  DL_CHECK(n > 0 && classes > 0) << "n=" << n << " classes=" << classes;
  for (int64_t i = 0; i < n; ++i)
    DL_CHECK(labels[i] >= 0 && labels[i] < classes)
        << "label " << labels[i] << " of row " << i << " outside [0, " << classes << ")";
  // Scratch: labels, per-row loss and hit, in one workspace allocation.
  const size_t label_bytes = (sizeof(int32_t) * n + 7) / 8 * 8;
  char* ws =
      static_cast<char*>(detail::workspace(label_bytes + (sizeof(double) + sizeof(int)) * n));
  int32_t* d_labels = reinterpret_cast<int32_t*>(ws);
  double* d_loss = reinterpret_cast<double*>(ws + label_bytes);
  int* d_hit = reinterpret_cast<int*>(ws + label_bytes + sizeof(double) * n);
  DL_CUDA_CHECK(cudaMemcpy(d_labels, labels, sizeof(int32_t) * n, cudaMemcpyHostToDevice));
  ce_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, classes, logits, d_labels,
                                                         label_smoothing, dlogits, d_loss, d_hit);
  DL_CUDA_LAUNCH_CHECK();
  std::vector<double> loss(static_cast<size_t>(n));
  std::vector<int> hit(static_cast<size_t>(n));
  DL_CUDA_CHECK(cudaMemcpy(loss.data(), d_loss, sizeof(double) * n, cudaMemcpyDeviceToHost));
  DL_CUDA_CHECK(cudaMemcpy(hit.data(), d_hit, sizeof(int) * n, cudaMemcpyDeviceToHost));
  double total = 0;
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) total += loss[i], hits += hit[i];
  if (correct) *correct = hits;
  return float(total / double(n));
}

}  // namespace dlaunch::kernels::cuda
