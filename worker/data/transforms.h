// Turning stored uint8 images into normalised float tensors, with the CIFAR training
// augmentation: random crop of a zero-padded image (pad 4) and a horizontal flip with p = 0.5,
// as torchvision's RandomCrop(32, padding=4) + RandomHorizontalFlip(). The padding is zero in
// pixel space (what torchvision pads the raw image with), so after normalisation it is
// -mean/std. The random draw is a pure function of (seed, epoch, sample index): a sample gets
// the same crop whichever rank loads it, so results do not depend on the number of workers.
#pragma once

#include <cstdint>

#include "worker/data/dataset.h"

namespace dlaunch::data {

struct AugmentParams {
  int64_t dy = 0;  // crop offset in the padded image minus the padding, in [-pad, pad]
  int64_t dx = 0;
  bool flip = false;
};

inline constexpr int64_t kCropPadding = 4;

AugmentParams draw_augment(uint64_t seed, int64_t epoch, int64_t sample_index);

// Writes image `index` of `ds`, normalised per channel, into out[0 .. image_elems). With
// `augment` the crop/flip of draw_augment(seed, epoch, index) is applied.
void load_image(const ImageDataset& ds, int64_t index, bool augment, uint64_t seed, int64_t epoch,
                float* out);

}  // namespace dlaunch::data
