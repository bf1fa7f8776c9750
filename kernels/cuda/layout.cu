#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace dlaunch::kernels::cuda {
namespace {

// One thread per element of the source; writes its element at the destination layout.
__global__ void reorder_kernel(int64_t total, int64_t c, int64_t hw, int sb, int db,
                               const float* src, float* dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    // i = ((n * (c / sb) + blk) * hw + p) * sb + j; an image holds c * hw elements.
    const int64_t j = i % sb, p = (i / sb) % hw, blk = (i / (sb * hw)) % (c / sb),
                  n = i / (hw * c);
    const int64_t ch = blk * sb + j;
    dst[((n * (c / db) + ch / db) * hw + p) * db + ch % db] = src[i];
  }
}

}  // namespace

void reorder(const ActShape& s, const float* src, int dst_cblock, float* dst) {
  DL_CHECK(s.c % s.cblock == 0 && s.c % dst_cblock == 0)
      << "c=" << s.c << " src block=" << s.cblock << " dst block=" << dst_cblock;
  const int64_t total = s.numel();
  reorder_kernel<<<detail::blocks_for(total), detail::kThreads>>>(total, s.c, s.hw(), s.cblock,
                                                                   dst_cblock, src, dst);
  DL_CUDA_LAUNCH_CHECK();
}

}  // namespace dlaunch::kernels::cuda
