// Turning stored uint8 images into normalised float tensors, with the CIFAR training
// augmentation: random crop of a zero-padded image (pad 4) and a horizontal flip with p = 0.5,
// as torchvision's RandomCrop(32, padding=4) + RandomHorizontalFlip(). The padding is zero in
// pixel space (what torchvision pads the raw image with), so after normalisation it is
// -mean/std. The random draw is a pure function of (seed, epoch, sample index): a sample gets
// the same crop whichever rank loads it, so results do not depend on the number of workers.
// That math is kernels/augment.h, shared with the augment_batch op (data on the device).
//
// Images kept at their own sizes (ImageDataset::resampled(), --image_size) get torchvision's
// ImageNet transforms instead, drawn the same way per (seed, epoch, sample index):
// RandomResizedCrop(S, scale=(0.08, 1), ratio=(3/4, 4/3)) + RandomHorizontalFlip() for training,
// Resize(int(S * 256 / 224)) + CenterCrop(S) for testing, resizing as Pillow's bilinear filter
// (resize.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/augment.h"
#include "worker/data/dataset.h"

namespace dlaunch::data {

// The CIFAR augmentation's draws and per-pixel math live in kernels/augment.h, one code for this
// loader and the augment_batch op (CPU and CUDA), so both produce the same bytes.
using kernels::AugmentParams;
using kernels::AugmentRecipe;
using kernels::AugmentSpec;
using kernels::kCropPadding;

// A crop of an image: rows [top, top + height), columns [left, left + width).
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
};

// torchvision's RandomResizedCrop.get_params for an image_h x image_w image, scale (0.08, 1)
// and ratio (3/4, 4/3): up to 10 tries of a random area fraction and log-uniform aspect ratio
// (sides rounded half to even, as Python's round) that fit, else the central crop clamped to
// the ratio range. `uniform` returns draws in [0, 1).
template <typename Uniform>
CropBox random_resized_crop_box(int64_t image_h, int64_t image_w, Uniform&& uniform);
CropBox draw_resized_crop(uint64_t seed, int64_t epoch, int64_t sample_index, int64_t image_h,
                          int64_t image_w, bool* flip);

// The test transform's geometry: Resize(resize_to) of the shorter side (the longer one scaled
// and truncated, as torchvision computes it) then CenterCrop(size), offsets rounded half to even.
int64_t eval_resize_size(int64_t size);  // int(size * 256 / 224)
struct ResizedCenterCrop {
  int64_t resized_h = 0, resized_w = 0;
  CropBox crop;  // in the resized image
};
ResizedCenterCrop resized_center_crop(int64_t image_h, int64_t image_w, int64_t size);

// The crop and flip are drawn first, so the default recipe draws what it always did. height and
// width bound the cutout square (unused without cutout); one that does not fit is a UsageError
// naming --cutout.
AugmentParams draw_augment(uint64_t seed, int64_t epoch, int64_t sample_index,
                           const AugmentRecipe& recipe = {}, int64_t height = 0, int64_t width = 0);
// The alternating flip of a sample in an epoch: a per-run coin, inverted on odd epochs.
using kernels::alternating_flip;

// What kernels::augment_image and the augment_batch op need to produce `ds`'s images (at their
// stored size; not for resampled datasets): shape, normalisation and, with `augment`, the draws'
// seed, epoch and recipe. Throws UsageError for a cutout that does not fit the images or more
// channels than kernels::kMaxAugmentChannels.
AugmentSpec augment_spec(const ImageDataset& ds, bool augment, uint64_t seed, int64_t epoch,
                         const AugmentRecipe& recipe = {});

// Writes image `index` of `ds`, normalised per channel, into out[0 .. image_elems). With
// `augment` the crop/flip of draw_augment(seed, epoch, index) is applied.
// Image `index`'s pixels, planar CHW at its stored size: ds.image(index), or, for a dataset
// that decodes per epoch, decoded now into a buffer of the calling thread (valid until the
// thread's next call). Throws DataError if the bytes no longer decode.
const uint8_t* image_pixels(const ImageDataset& ds, int64_t index);

// For a resampled dataset `augment` picks the training transform, else the test one.
void load_image(const ImageDataset& ds, int64_t index, bool augment, uint64_t seed, int64_t epoch,
                float* out, const AugmentRecipe& recipe = {});

// The transforms only (RGB planes of size * size, uint8, before normalisation), for tests and
// load_image: what torchvision's transform pipeline would hand to ToTensor.
void resized_crop_pixels(const ImageDataset& ds, int64_t index, const CropBox& box, int64_t size,
                         uint8_t* out, std::vector<uint8_t>& scratch);
void eval_pixels(const ImageDataset& ds, int64_t index, int64_t size, uint8_t* out,
                 std::vector<uint8_t>& scratch);

template <typename Uniform>
CropBox random_resized_crop_box(int64_t image_h, int64_t image_w, Uniform&& uniform) {
  const double area = static_cast<double>(image_h * image_w);
  const double log_lo = std::log(3.0 / 4.0), log_hi = std::log(4.0 / 3.0);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * (0.08 + (1.0 - 0.08) * uniform());
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * uniform());
    const auto w = static_cast<int64_t>(std::nearbyint(std::sqrt(target_area * aspect)));
    const auto h = static_cast<int64_t>(std::nearbyint(std::sqrt(target_area / aspect)));
    if (0 < w && w <= image_w && 0 < h && h <= image_h) {
      // torch.randint(0, n + 1): uniform over [0, n].
      const auto top =
          std::min<int64_t>(static_cast<int64_t>(uniform() * (image_h - h + 1)), image_h - h);
      const auto left =
          std::min<int64_t>(static_cast<int64_t>(uniform() * (image_w - w + 1)), image_w - w);
      return {top, left, h, w};
    }
  }
  // Fallback: the whole image, cut to the nearest allowed ratio.
  const double in_ratio = static_cast<double>(image_w) / static_cast<double>(image_h);
  int64_t w = image_w, h = image_h;
  if (in_ratio < 3.0 / 4.0) {
    h = static_cast<int64_t>(std::nearbyint(static_cast<double>(w) / (3.0 / 4.0)));
  } else if (in_ratio > 4.0 / 3.0) {
    w = static_cast<int64_t>(std::nearbyint(static_cast<double>(h) * (4.0 / 3.0)));
  }
  return {(image_h - h) / 2, (image_w - w) / 2, h, w};
}

}  // namespace dlaunch::data
