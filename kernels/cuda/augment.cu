// augment_batch on the GPU: one block per image (grid-stride over the batch); the block's first
// thread draws the image's crop, flip and cutout (kernels/augment.h, the CPU loader's draws),
// then every thread writes elements with the loader's per-element math.
#include "kernels/augment.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace dlaunch::kernels::cuda {
namespace {

__global__ void augment_kernel(AugmentSpec spec, int64_t n, const uint8_t* images,
                               const int64_t* indices, float* out) {
  // Raw storage: a __shared__ variable may not have AugmentParams' default member initialisers.
  __shared__ alignas(AugmentParams) unsigned char draw_storage[sizeof(AugmentParams)];
  AugmentParams& draw = *reinterpret_cast<AugmentParams*>(draw_storage);
  // Within an image 32-bit arithmetic: 64-bit division is many instructions on a GPU, and no
  // image we keep on the device has 2^31 elements (the 2 GiB bound is for whole splits).
  const int elems = static_cast<int>(spec.image_elems());
  const int plane = static_cast<int>(spec.height * spec.width),
            width = static_cast<int>(spec.width);
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t index = indices[i];
    if (threadIdx.x == 0) draw = spec.draw(index);
    __syncthreads();
    const uint8_t* image = images + index * elems;
    for (int e = threadIdx.x; e < elems; e += blockDim.x) {
      const int c = e / plane, y = (e % plane) / width, x = e % width;
      out[i * elems + e] = augmented_element(spec, draw, image, c, y, x);
    }
    __syncthreads();  // before the next image's draw overwrites this one's
  }
}

}  // namespace

void augment_batch(const AugmentSpec& spec, int64_t n, const uint8_t* images,
                   const int64_t* indices, float* out) {
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(n < 65535 * 4 ? n : 65535 * 4);
  augment_kernel<<<blocks, detail::kThreads>>>(spec, n, images, indices, out);
  DL_CUDA_LAUNCH_CHECK();
}

}  // namespace dlaunch::kernels::cuda
