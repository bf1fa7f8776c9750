// Flip test-time augmentation (--tta flip): the classifier sees each test image and its mirror
// image and the two logits are averaged, as airbench and torchvision's evaluation do. It costs
// a second forward per test batch and is never used in training.
#pragma once

#include "worker/model/resnet.h"
#include "worker/tensor.h"

namespace dlaunch::model {

// images (N, C, H, W) mirrored left-right by the backend's flip_horizontal op, on the same
// backend as images (on a GPU nothing crosses to the host).
Tensor flip_horizontal(const Tensor& images);

// (model.forward(images) + model.forward(flip_horizontal(images))) / 2 in eval mode, on the
// model's backend (images on the host are copied there once and mirrored there). Blocks like
// ResNet::forward; throws what it throws.
Tensor flip_tta_logits(ResNet& model, const Tensor& images);

}  // namespace dlaunch::model
