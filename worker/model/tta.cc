#include "worker/model/tta.h"

#include "common/error.h"

namespace dlaunch::model {

Tensor flip_horizontal(const Tensor& images) {
  DL_CHECK(images.ndim() == 4) << "images must be (N, C, H, W), got " << images.shape_string();
  Tensor flipped(images.shape(), images.backend());
  images.backend().flip_horizontal({images.dim(0), images.dim(1), images.dim(2), images.dim(3), 1},
                                   images.data(), flipped.data());
  return flipped;
}

Tensor flip_tta_logits(ResNet& model, const Tensor& images) {
  Tensor mean = model.forward(images, /*training=*/false);  // a copy: forward reuses its output
  kernels::Backend& be = mean.backend();
  // A batch loaded on the host goes to the model's device once and is mirrored there.
  Tensor staged(be);
  if (&images.backend() != &be) staged.copy_from(images);
  const Tensor& mirrored =
      model.forward(flip_horizontal(staged.empty() ? images : staged), /*training=*/false);
  be.add(mean.numel(), mean.data(), mirrored.data(), mean.data());
  be.scale(mean.numel(), 0.5f, mean.data(), mean.data());
  return mean;
}

}  // namespace dlaunch::model
