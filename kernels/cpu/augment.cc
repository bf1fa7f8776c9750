// augment_batch on the CPU: kernels::augment_image, the loader's own loop, one image per OpenMP
// thread.
#include "kernels/augment.h"
#include "kernels/ops.h"
#include "kernels/profile.h"

namespace dlaunch::kernels::cpu {

void augment_batch(const AugmentSpec& spec, int64_t n, const uint8_t* images,
                   const int64_t* indices, float* out) {
  ScopedOpTimer timer("augment_batch");
  const int64_t elems = spec.image_elems();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    augment_image(spec, indices[i], images + indices[i] * elems, out + i * elems);
}

}  // namespace dlaunch::kernels::cpu
