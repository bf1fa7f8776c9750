#include "worker/model/tta.h"

#include <algorithm>
#include <vector>

#include "common/error.h"

namespace dlaunch::model {

Tensor flip_horizontal(const Tensor& images) {
  DL_CHECK(images.ndim() == 4) << "images must be (N, C, H, W), got " << images.shape_string();
  const int64_t rows = images.dim(0) * images.dim(1) * images.dim(2), width = images.dim(3);
  std::vector<float> pixels = images.to_host();
  for (int64_t r = 0; r < rows; ++r) std::reverse(pixels.begin() + r * width, pixels.begin() + (r + 1) * width);
  Tensor flipped(images.shape(), images.backend());
  flipped.copy_from_host(pixels.data());
  return flipped;
}

Tensor flip_tta_logits(ResNet& model, const Tensor& images) {
  Tensor mean = model.forward(images, /*training=*/false);  // a copy: forward reuses its output
  const Tensor& mirrored = model.forward(flip_horizontal(images), /*training=*/false);
  kernels::Backend& be = mean.backend();
  be.add(mean.numel(), mean.data(), mirrored.data(), mean.data());
  be.scale(mean.numel(), 0.5f, mean.data(), mean.data());
  return mean;
}

}  // namespace dlaunch::model
