// Follows Pillow 9.4's libImaging/Resample.c (precompute_coeffs, normalize_coeffs_8bpc,
// ImagingResampleHorizontal_8bpc/Vertical_8bpc) so that results match it pixel for pixel; the
// names of the steps are Pillow's.
#include "worker/data/resize.h"

#include <algorithm>
#include <cmath>

namespace dlaunch::data {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

struct Coeffs {
  int64_t ksize = 0;
  std::vector<int64_t> bounds;   // per output: first input index, number of inputs
  std::vector<int32_t> weights;  // per output: ksize fixed-point weights
};

double bilinear_filter(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// The input span and weights of each output sample, for in_size inputs mapped onto out_size.
Coeffs precompute_coeffs(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filterscale = std::max(scale, 1.0);  // widen the filter when shrinking
  const double support = 1.0 * filterscale;         // bilinear support is 1
  Coeffs c;
  c.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(2 * out_size);
  c.weights.assign(out_size * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int64_t xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    // Pillow's (int) casts truncate toward zero.
    int64_t xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int64_t xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int64_t x = 0; x < xmax; ++x) {
      k[x] = bilinear_filter((x + xmin - center + 0.5) * ss);
      ww += k[x];
    }
    for (int64_t x = 0; x < xmax; ++x) {
      const double w = ww != 0.0 ? k[x] / ww : k[x];
      // normalize_coeffs_8bpc: round half away from zero to 22 fractional bits.
      c.weights[xx * c.ksize + x] = static_cast<int32_t>(w < 0 ? -0.5 + w * (1 << kPrecisionBits)
                                                               : 0.5 + w * (1 << kPrecisionBits));
    }
    c.bounds[2 * xx] = xmin;
    c.bounds[2 * xx + 1] = xmax;
  }
  return c;
}

inline uint8_t clip8(int64_t acc) {
  return static_cast<uint8_t>(std::clamp<int64_t>(acc >> kPrecisionBits, 0, 255));
}

}  // namespace

void resize_bilinear(const PlaneView& src, int64_t out_rows, int64_t out_cols, uint8_t* dst,
                     std::vector<uint8_t>& scratch) {
  const bool horizontal = out_cols != src.cols, vertical = out_rows != src.rows;
  const Coeffs ch = precompute_coeffs(src.cols, out_cols);
  const Coeffs cv = precompute_coeffs(src.rows, out_rows);
  // The horizontal pass covers only the rows the vertical pass reads (as Pillow's box does).
  const int64_t first_row = cv.bounds[0];
  const int64_t last_row = cv.bounds[2 * (out_rows - 1)] + cv.bounds[2 * (out_rows - 1) + 1];
  PlaneView mid = src;
  int64_t row_shift = 0;
  if (horizontal) {
    const int64_t rows = vertical ? last_row - first_row : src.rows;
    if (vertical) row_shift = first_row;
    uint8_t* out = dst;
    if (vertical) {
      scratch.resize(rows * out_cols);
      out = scratch.data();
    }
    for (int64_t y = 0; y < rows; ++y) {
      const uint8_t* in = src.data + (y + row_shift) * src.stride;
      for (int64_t xx = 0; xx < out_cols; ++xx) {
        const int64_t xmin = ch.bounds[2 * xx], xmax = ch.bounds[2 * xx + 1];
        const int32_t* k = ch.weights.data() + xx * ch.ksize;
        int64_t acc = 1 << (kPrecisionBits - 1);
        for (int64_t x = 0; x < xmax; ++x) acc += in[xmin + x] * int64_t{k[x]};
        out[y * out_cols + xx] = clip8(acc);
      }
    }
    if (!vertical) return;
    mid = PlaneView{scratch.data(), rows, out_cols, out_cols};
  }
  if (!vertical) {  // same size both ways: a copy
    for (int64_t y = 0; y < src.rows; ++y)
      std::copy_n(src.data + y * src.stride, src.cols, dst + y * src.cols);
    return;
  }
  for (int64_t yy = 0; yy < out_rows; ++yy) {
    const int64_t ymin = cv.bounds[2 * yy] - row_shift, ymax = cv.bounds[2 * yy + 1];
    const int32_t* k = cv.weights.data() + yy * cv.ksize;
    for (int64_t xx = 0; xx < mid.cols; ++xx) {
      int64_t acc = 1 << (kPrecisionBits - 1);
      for (int64_t y = 0; y < ymax; ++y)
        acc += mid.data[(ymin + y) * mid.stride + xx] * int64_t{k[y]};
      dst[yy * mid.cols + xx] = clip8(acc);
    }
  }
}

}  // namespace dlaunch::data
