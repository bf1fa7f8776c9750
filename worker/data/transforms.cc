#include "worker/data/transforms.h"

#include "worker/data/random.h"

namespace dlaunch::data {

AugmentParams draw_augment(uint64_t seed, int64_t epoch, int64_t sample_index) {
  SplitMix rng(hash_combine(hash_combine(seed, static_cast<uint64_t>(epoch) + 0xA06ull),
                            static_cast<uint64_t>(sample_index)));
  AugmentParams p;
  p.dy = static_cast<int64_t>(rng.below(2 * kCropPadding + 1)) - kCropPadding;
  p.dx = static_cast<int64_t>(rng.below(2 * kCropPadding + 1)) - kCropPadding;
  p.flip = (rng.next() & 1) != 0;
  return p;
}

void load_image(const ImageDataset& ds, int64_t index, bool augment, uint64_t seed, int64_t epoch,
                float* out) {
  const uint8_t* src = ds.image(index);
  const int64_t h = ds.height, w = ds.width;
  AugmentParams a;
  if (augment) a = draw_augment(seed, epoch, index);
  for (int64_t c = 0; c < ds.channels; ++c) {
    const float scale = 1.0f / (255.0f * ds.stddev[c]);
    const float shift = -ds.mean[c] / ds.stddev[c];
    const uint8_t* plane = src + c * h * w;
    float* dst = out + c * h * w;
    for (int64_t y = 0; y < h; ++y) {
      int64_t sy = y + a.dy;
      for (int64_t x = 0; x < w; ++x) {
        int64_t ox = a.flip ? w - 1 - x : x;  // flip after the crop, as torchvision's order
        int64_t sx = x + a.dx;
        float v = shift;  // padded pixel = 0 before normalisation
        if (sy >= 0 && sy < h && sx >= 0 && sx < w) v = plane[sy * w + sx] * scale + shift;
        dst[y * w + ox] = v;
      }
    }
  }
}

}  // namespace dlaunch::data
