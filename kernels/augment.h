// The CIFAR training augmentation of one image, from stored uint8 planar CHW pixels to a
// normalised float CHW image, written once for the CPU loader (data::load_image) and the
// augment_batch op on either device (cpu/augment.cc, cuda/augment.cu): this header compiles as
// C++ and as CUDA, so both compute the same bytes from the same draws.
//
// The augmentation: random crop of a zero-padded image (pad 4) and a horizontal flip with
// p = 0.5, as torchvision's RandomCrop(32, padding=4) + RandomHorizontalFlip(); with the fast
// recipe (airbench) optionally a cutout square and a per-run flip inverted every other epoch
// (AugmentRecipe). The padding is zero in pixel space (what torchvision pads the raw image with),
// so after normalisation it is -mean/std. Every draw is a pure function of (seed, epoch, sample
// index) (kernels/splitmix.h): a sample gets the same crop whichever rank or device loads it.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"  // DL_HOST_DEVICE
#include "kernels/splitmix.h"

namespace dlaunch::kernels {

inline constexpr int64_t kCropPadding = 4;
// Channels an AugmentSpec carries normalisation constants for (RGB and grey images need 3 and 1).
inline constexpr int kMaxAugmentChannels = 4;

// Options of the fast CIFAR recipe (airbench), off by default; they apply to training images
// when augmentation is on, drawn per (seed, epoch, sample index) like the crop:
//   cutout:           a cutout x cutout square, wholly inside the image at a uniformly drawn
//                     position, set to 0 after normalisation (the mean pixel), airbench's
//                     make_random_square_masks;
//   alternating_flip: each sample's flip is drawn once per run (seed, sample index) and
//                     inverted every other epoch, so a sample is seen both ways in any two
//                     consecutive epochs (instead of a coin per epoch).
struct AugmentRecipe {
  int64_t cutout = 0;  // side in pixels; 0 = off
  bool alternating_flip = false;
};

struct AugmentParams {
  int64_t dy = 0;  // crop offset in the padded image minus the padding, in [-pad, pad]
  int64_t dx = 0;
  bool flip = false;
  int64_t cutout_top = 0, cutout_left = 0;  // the cutout square's corner (recipe.cutout > 0)
};

// The alternating flip of a sample in an epoch: a per-run coin, inverted on odd epochs.
DL_HOST_DEVICE bool alternating_flip(uint64_t seed, int64_t epoch, int64_t sample_index) {
  const bool coin =
      (hash_combine(hash_combine(seed, 0xF11Bull), static_cast<uint64_t>(sample_index)) & 1) != 0;
  return coin != ((epoch & 1) != 0);
}

// The draws of one sample. The crop and flip come first, so the default recipe draws what it
// always did. The cutout square must fit a height x width image (callers check: data::
// augment_spec throws a UsageError naming --cutout).
DL_HOST_DEVICE AugmentParams draw_augment_params(uint64_t seed, int64_t epoch, int64_t sample_index,
                                                 const AugmentRecipe& recipe, int64_t height,
                                                 int64_t width) {
  SplitMix rng(hash_combine(hash_combine(seed, static_cast<uint64_t>(epoch) + 0xA06ull),
                            static_cast<uint64_t>(sample_index)));
  AugmentParams p;
  p.dy = static_cast<int64_t>(rng.below(2 * kCropPadding + 1)) - kCropPadding;
  p.dx = static_cast<int64_t>(rng.below(2 * kCropPadding + 1)) - kCropPadding;
  p.flip = (rng.next() & 1) != 0;
  if (recipe.alternating_flip) p.flip = alternating_flip(seed, epoch, sample_index);
  if (recipe.cutout > 0) {
    p.cutout_top =
        static_cast<int64_t>(rng.below(static_cast<uint64_t>(height - recipe.cutout + 1)));
    p.cutout_left =
        static_cast<int64_t>(rng.below(static_cast<uint64_t>(width - recipe.cutout + 1)));
  }
  return p;
}

// Normalisation per channel: out = pixel * scale + shift = (pixel / 255 - mean) / stddev.
DL_HOST_DEVICE float normalise_scale(float stddev) {
  return 1.0f / (255.0f * stddev);
}
DL_HOST_DEVICE float normalise_shift(float mean, float stddev) {
  return -mean / stddev;
}
DL_HOST_DEVICE float normalise_pixel(uint8_t pixel, float scale, float shift) {
#if defined(__CUDA_ARCH__)
  // nvcc would contract the multiply-add into one FMA (one rounding); the CPU build (x86-64's
  // baseline ISA has no FMA) rounds the product and then the sum, so the device does the same.
  return __fadd_rn(__fmul_rn(static_cast<float>(pixel), scale), shift);
#else
  return static_cast<float>(pixel) * scale + shift;
#endif
}

// What producing a batch needs to know besides the pixels: the images' shape, the normalisation,
// and whether and how to augment (the draws' key: seed and epoch; the sample index is the
// image's index in its split).
struct AugmentSpec {
  int64_t channels = 0, height = 0, width = 0;
  float scale[kMaxAugmentChannels] = {};
  float shift[kMaxAugmentChannels] = {};
  bool augment = false;  // false: normalisation only (test images)
  AugmentRecipe recipe;
  uint64_t seed = 0;
  int64_t epoch = 0;

  DL_HOST_DEVICE int64_t image_elems() const { return channels * height * width; }
  DL_HOST_DEVICE AugmentParams draw(int64_t sample_index) const {
    return augment ? draw_augment_params(seed, epoch, sample_index, recipe, height, width)
                   : AugmentParams{};
  }
};

// The geometry, in pieces both loops below use: output row y reads source row y + dy; output
// column x reads source column x + dx, mirrored first when flipped (the flip comes after the
// crop, torchvision's order); a source pixel outside the image is padding, 0 before
// normalisation; the cutout square is in output coordinates and 0 after normalisation.
DL_HOST_DEVICE int64_t source_row(const AugmentParams& a, int64_t y) {
  return y + a.dy;
}
DL_HOST_DEVICE int64_t source_column(const AugmentSpec& s, const AugmentParams& a, int64_t x) {
  return (a.flip ? s.width - 1 - x : x) + a.dx;
}
DL_HOST_DEVICE bool inside(int64_t v, int64_t size) {
  return v >= 0 && v < size;
}
DL_HOST_DEVICE int64_t cutout_side(const AugmentSpec& s) {
  return s.augment ? s.recipe.cutout : 0;
}
DL_HOST_DEVICE bool in_cutout(const AugmentSpec& s, const AugmentParams& a, int64_t y, int64_t x) {
  const int64_t cut = cutout_side(s);
  return cut > 0 && y >= a.cutout_top && y < a.cutout_top + cut && x >= a.cutout_left &&
         x < a.cutout_left + cut;
}

// Output element (c, y, x) of an image augmented with the draws `a` (spec.draw of its index): the
// GPU kernel's unit of work.
DL_HOST_DEVICE float augmented_element(const AugmentSpec& s, const AugmentParams& a,
                                       const uint8_t* image, int64_t c, int64_t y, int64_t x) {
  if (in_cutout(s, a, y, x)) return 0.0f;
  const int64_t sy = source_row(a, y), sx = source_column(s, a, x);
  if (!inside(sy, s.height) || !inside(sx, s.width)) return s.shift[c];
  return normalise_pixel(image[(c * s.height + sy) * s.width + sx], s.scale[c], s.shift[c]);
}

// The whole image `sample_index` (its pixels at `image`) into out[0 .. spec.image_elems()), on
// the host: the CPU loader's and the CPU op's loop. augmented_element's pieces with what is
// constant along a row hoisted out of the row (calling augmented_element per element made the
// CPU loader 1.4x slower: bench/data/bench_batch_assembly), and the cutout written over the rows
// it covers afterwards.
inline void augment_image(const AugmentSpec& s, int64_t sample_index, const uint8_t* image,
                          float* out) {
  const AugmentParams a = s.draw(sample_index);
  const int64_t h = s.height, w = s.width, cut = cutout_side(s);
  for (int64_t c = 0; c < s.channels; ++c) {
    const float scale = s.scale[c], shift = s.shift[c];
    for (int64_t y = 0; y < h; ++y) {
      float* dst = out + (c * h + y) * w;
      const int64_t sy = source_row(a, y);
      if (!inside(sy, h)) {
        for (int64_t x = 0; x < w; ++x) dst[x] = shift;
      } else {
        const uint8_t* row = image + (c * h + sy) * w;
        for (int64_t x = 0; x < w; ++x) {
          const int64_t sx = source_column(s, a, x);
          dst[x] = inside(sx, w) ? normalise_pixel(row[sx], scale, shift) : shift;
        }
      }
      if (cut > 0 && in_cutout(s, a, y, a.cutout_left)) {
        for (int64_t x = a.cutout_left; x < a.cutout_left + cut; ++x) dst[x] = 0.0f;
      }
    }
  }
}

}  // namespace dlaunch::kernels
