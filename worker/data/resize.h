// Pillow's bilinear resize (Image.resize(size, Image.BILINEAR), what torchvision's Resize and
// RandomResizedCrop run on PIL images), reproduced for 8-bit planes: the same separable
// triangle filter widened by the downscale factor (antialiasing), the same 22-bit fixed-point
// weights and rounding, horizontal pass first. tests/worker/image_resize_test.cc compares it
// with Pillow 9.4 on real images.
//
// Pure function, no allocation beyond a scratch row buffer; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace dlaunch::data {

// A rectangle of a uint8 plane: `rows` x `cols` values, row r starting at data + r * stride.
struct PlaneView {
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0, stride = 0;
};

// Resizes `src` to out_rows x out_cols into `dst` (row-major, packed). `scratch` is reused
// between calls to avoid an allocation per image.
void resize_bilinear(const PlaneView& src, int64_t out_rows, int64_t out_cols, uint8_t* dst,
                     std::vector<uint8_t>& scratch);

}  // namespace dlaunch::data
