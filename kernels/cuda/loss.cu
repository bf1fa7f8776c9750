#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace dlaunch::kernels::cuda {
namespace {

// A thread per row (grid-stride; classes are few): loss and hit per row, gradient when asked.
__global__ void ce_kernel(int64_t n, int64_t k, const float* logits, const int32_t* labels,
                          float* dlogits, double* row_loss, int* row_hit) {
  DL_GRID_LOOP(i, n) {
    const float* row = logits + i * k;
    int64_t arg = 0;
    for (int64_t j = 1; j < k; ++j)
      if (row[j] > row[arg]) arg = j;
    const double mx = row[arg];
    double z = 0;
    for (int64_t j = 0; j < k; ++j) z += exp(double(row[j]) - mx);
    const double lse = mx + log(z);
    const int32_t label = labels[i];
    row_loss[i] = lse - row[label];
    row_hit[i] = arg == label;
    if (dlogits)
      for (int64_t j = 0; j < k; ++j)
        dlogits[i * k + j] = float((exp(double(row[j]) - lse) - (j == label ? 1.0 : 0.0)) / double(n));
  }
}

}  // namespace

float softmax_cross_entropy(int64_t n, int64_t classes, const float* logits,
                            const int32_t* labels, float* dlogits, int64_t* correct) {
  DL_CHECK(n > 0 && classes > 0) << "n=" << n << " classes=" << classes;
  for (int64_t i = 0; i < n; ++i)
    DL_CHECK(labels[i] >= 0 && labels[i] < classes)
        << "label " << labels[i] << " of row " << i << " outside [0, " << classes << ")";
  // Scratch: labels, per-row loss and hit, in one workspace allocation.
  const size_t label_bytes = (sizeof(int32_t) * n + 7) / 8 * 8;
  char* ws = static_cast<char*>(detail::workspace(label_bytes + (sizeof(double) + sizeof(int)) * n));
  int32_t* d_labels = reinterpret_cast<int32_t*>(ws);
  double* d_loss = reinterpret_cast<double*>(ws + label_bytes);
  int* d_hit = reinterpret_cast<int*>(ws + label_bytes + sizeof(double) * n);
  DL_CUDA_CHECK(cudaMemcpy(d_labels, labels, sizeof(int32_t) * n, cudaMemcpyHostToDevice));
  ce_kernel<<<detail::blocks_for(n), detail::kThreads>>>(n, classes, logits, d_labels, dlogits,
                                                         d_loss, d_hit);
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
