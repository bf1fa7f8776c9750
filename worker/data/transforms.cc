#include "worker/data/transforms.h"

#include <fmt/format.h>

#include "worker/data/image_decode.h"
#include "worker/data/random.h"
#include "worker/data/resize.h"

namespace dlaunch::data {
namespace {

// Writes uint8 planes of h x w (CHW) normalised into out.
void normalise(const ImageDataset& ds, const uint8_t* planes, int64_t h, int64_t w, float* out) {
  for (int64_t c = 0; c < ds.channels; ++c) {
    const float scale = kernels::normalise_scale(ds.stddev[c]);
    const float shift = kernels::normalise_shift(ds.mean[c], ds.stddev[c]);
    for (int64_t p = 0; p < h * w; ++p)
      out[c * h * w + p] = kernels::normalise_pixel(planes[c * h * w + p], scale, shift);
  }
}

void check_cutout_fits(const AugmentRecipe& recipe, int64_t height, int64_t width) {
  if (recipe.cutout > 0 && (recipe.cutout > height || recipe.cutout > width))
    throw UsageError(fmt::format("--cutout={} does not fit the {}x{} images; expected a side of "
                                 "at most {} pixels",
                                 recipe.cutout, height, width, std::min(height, width)));
}

PlaneView plane_of(const uint8_t* image, int64_t h, int64_t w, int64_t c, const CropBox& box) {
  return {image + c * h * w + box.top * w + box.left, box.height, box.width, w};
}

}  // namespace

const uint8_t* image_pixels(const ImageDataset& ds, int64_t index) {
  if (!ds.decodes_per_epoch()) return ds.image(index);
  thread_local ImageDecoder decoder;
  thread_local DecodedImage decoded;
  thread_local std::vector<uint8_t> planar;
  const int64_t begin = ds.encoded_offsets[index], end = ds.encoded_offsets[index + 1];
  std::string error;
  if (!decoder.decode(ds.encoded.data() + begin, static_cast<size_t>(end - begin), decoded,
                      error)) {
    // It decoded when the split was loaded; the bytes are ours and in memory.
    throw DataError(fmt::format("image {} of {} ({}) decoded at start but not now: {}", index,
                                ds.name, ds.sources[index], error));
  }
  const int64_t plane = int64_t{decoded.width} * decoded.height;
  DL_CHECK(decoded.height == ds.stored_height(index) && decoded.width == ds.stored_width(index))
      << ds.sources[index] << " is " << decoded.width << "x" << decoded.height;
  planar.resize(3 * plane);
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t p = 0; p < plane; ++p) planar[c * plane + p] = decoded.rgb[3 * p + c];
  return planar.data();
}

AugmentSpec augment_spec(const ImageDataset& ds, bool augment, uint64_t seed, int64_t epoch,
                         const AugmentRecipe& recipe) {
  // Our datasets are grey or RGB.
  DL_CHECK(ds.channels <= kernels::kMaxAugmentChannels) << ds.name << ": " << ds.channels;
  if (augment) check_cutout_fits(recipe, ds.height, ds.width);
  AugmentSpec s;
  s.channels = ds.channels;
  s.height = ds.height;
  s.width = ds.width;
  for (int64_t c = 0; c < ds.channels; ++c) {
    s.scale[c] = kernels::normalise_scale(ds.stddev[c]);
    s.shift[c] = kernels::normalise_shift(ds.mean[c], ds.stddev[c]);
  }
  s.augment = augment;
  if (augment) s.recipe = recipe;
  s.seed = seed;
  s.epoch = epoch;
  return s;
}

AugmentParams draw_augment(uint64_t seed, int64_t epoch, int64_t sample_index,
                           const AugmentRecipe& recipe, int64_t height, int64_t width) {
  check_cutout_fits(recipe, height, width);
  return kernels::draw_augment_params(seed, epoch, sample_index, recipe, height, width);
}

CropBox draw_resized_crop(uint64_t seed, int64_t epoch, int64_t sample_index, int64_t image_h,
                          int64_t image_w, bool* flip) {
  // Another stream than draw_augment's (salt 0x5C), the same pure function of its arguments.
  SplitMix rng(hash_combine(hash_combine(seed, static_cast<uint64_t>(epoch) + 0x5C0ull),
                            static_cast<uint64_t>(sample_index)));
  const CropBox box = random_resized_crop_box(image_h, image_w, [&] { return rng.uniform(); });
  *flip = (rng.next() & 1) != 0;
  return box;
}

int64_t eval_resize_size(int64_t size) {
  return static_cast<int64_t>(static_cast<double>(size) * 256.0 / 224.0);
}

ResizedCenterCrop resized_center_crop(int64_t image_h, int64_t image_w, int64_t size) {
  const int64_t to = eval_resize_size(size);
  ResizedCenterCrop r;
  // torchvision's _compute_resized_output_size: the shorter side becomes `to`, the longer one
  // int(to * long / short).
  if (image_w <= image_h) {
    r.resized_w = to;
    r.resized_h = static_cast<int64_t>(static_cast<double>(to) * image_h / image_w);
  } else {
    r.resized_h = to;
    r.resized_w = static_cast<int64_t>(static_cast<double>(to) * image_w / image_h);
  }
  r.crop = {static_cast<int64_t>(std::nearbyint((r.resized_h - size) / 2.0)),
            static_cast<int64_t>(std::nearbyint((r.resized_w - size) / 2.0)), size, size};
  return r;
}

void resized_crop_pixels(const ImageDataset& ds, int64_t index, const CropBox& box, int64_t size,
                         uint8_t* out, std::vector<uint8_t>& scratch) {
  const uint8_t* image = image_pixels(ds, index);
  const int64_t h = ds.stored_height(index), w = ds.stored_width(index);
  for (int64_t c = 0; c < ds.channels; ++c)
    resize_bilinear(plane_of(image, h, w, c, box), size, size, out + c * size * size, scratch);
}

void eval_pixels(const ImageDataset& ds, int64_t index, int64_t size, uint8_t* out,
                 std::vector<uint8_t>& scratch) {
  const int64_t h = ds.stored_height(index), w = ds.stored_width(index);
  const ResizedCenterCrop g = resized_center_crop(h, w, size);
  std::vector<uint8_t> resized(g.resized_h * g.resized_w);
  const uint8_t* image = image_pixels(ds, index);
  for (int64_t c = 0; c < ds.channels; ++c) {
    resize_bilinear(plane_of(image, h, w, c, {0, 0, h, w}), g.resized_h, g.resized_w,
                    resized.data(), scratch);
    for (int64_t y = 0; y < size; ++y)
      std::copy_n(resized.data() + (g.crop.top + y) * g.resized_w + g.crop.left, size,
                  out + (c * size + y) * size);
  }
}

void load_image(const ImageDataset& ds, int64_t index, bool augment, uint64_t seed, int64_t epoch,
                float* out, const AugmentRecipe& recipe) {
  if (augment && (recipe.cutout > 0 || recipe.alternating_flip) && ds.resampled())
    throw UsageError("--cutout and --alternating_flip apply to images at their own size (the "
                     "CIFAR crop and flip); drop them or --image_size");
  if (ds.resampled()) {
    // One set of buffers per loader thread: a batch reuses them image after image.
    thread_local std::vector<uint8_t> planes, scratch;
    const int64_t s = ds.height;  // resampled datasets are square: --image_size
    planes.resize(ds.channels * s * s);
    if (augment) {
      bool flip = false;
      const CropBox box = draw_resized_crop(seed, epoch, index, ds.stored_height(index),
                                            ds.stored_width(index), &flip);
      resized_crop_pixels(ds, index, box, s, planes.data(), scratch);
      if (flip) {
        for (int64_t r = 0; r < ds.channels * s; ++r)
          std::reverse(planes.begin() + r * s, planes.begin() + (r + 1) * s);
      }
    } else {
      eval_pixels(ds, index, s, planes.data(), scratch);
    }
    normalise(ds, planes.data(), s, s, out);
    return;
  }
  kernels::augment_image(augment_spec(ds, augment, seed, epoch, recipe), index,
                         image_pixels(ds, index), out);
}

}  // namespace dlaunch::data
