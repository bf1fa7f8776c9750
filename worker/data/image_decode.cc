#include "worker/data/image_decode.h"

#include <fmt/format.h>
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <csetjmp>
#include <cstring>

namespace dlaunch::data {
namespace {

// Pillow's MULDIV255 (libImaging/Convert.c): a * b / 255, rounded.
inline int muldiv255(int a, int b) {
  int tmp = a * b + 128;
  return ((tmp >> 8) + tmp) >> 8;
}

// Pillow's cmyk2rgb on Adobe-inverted input (Pillow reads every CMYK JPEG as "CMYK;I").
void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, size_t pixels) {
  for (size_t i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
    const int nk = cmyk[3];  // 255 - K, K being the inverted byte
    for (int c = 0; c < 3; ++c) {
      rgb[c] = static_cast<uint8_t>(std::clamp(nk - muldiv255(255 - cmyk[c], nk), 0, 255));
    }
  }
}

struct PngReader {
  const uint8_t* data;
  size_t size;
  size_t pos;
  char message[256];
};

void png_read_bytes(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (r->size - r->pos < n) png_error(png, "file ends early (truncated)");
  std::memcpy(out, r->data + r->pos, n);
  r->pos += n;
}

void png_on_error(png_structp png, png_const_charp msg) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof r->message, "%s", msg);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

// libpng reports errors by longjmp: only trivially destructible locals live in this frame, and
// the vectors it fills belong to the caller, so the jump skips no destructor.
bool decode_png(const uint8_t* data, size_t size, std::vector<uint8_t>& raw,
                std::vector<png_bytep>& rows, DecodedImage& out, std::string& error) {
  PngReader reader{data, size, 0, {0}};
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, png_on_error, png_on_warning);
  if (png == nullptr) {
    error = "libpng could not allocate a reader";
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    error = fmt::format("corrupt PNG: {}", reader.message[0] ? reader.message : "libpng error");
    png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    return false;
  }
  png_set_read_fn(png, &reader, png_read_bytes);
  png_read_info(png, info);
  const png_uint_32 width = png_get_image_width(png, info);
  const png_uint_32 height = png_get_image_height(png, info);
  const int color = png_get_color_type(png, info);
  const int depth = png_get_bit_depth(png, info);
  // Pillow opens 16-bit gray as mode "I" and clips to 255 on conversion; every other 16-bit
  // image is read through a ";16B" raw mode that keeps the high byte (png_set_strip_16).
  const bool gray16 = color == PNG_COLOR_TYPE_GRAY && depth == 16;
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16 && !gray16) png_set_strip_16(png);
  if (depth == 16 && gray16) png_set_swap(png);  // host order for the clip below
  // Alpha is not stripped here: a palette's tRNS comes out of libpng's expansion as a fourth
  // channel whatever we ask, so the copy below takes the colour channels of whatever arrives.
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  const int channels = png_get_channels(png, info);
  raw.resize(row_bytes * height);
  rows.resize(height);
  for (png_uint_32 y = 0; y < height; ++y) rows[y] = raw.data() + y * row_bytes;
  png_read_image(png, rows.data());
  png_destroy_read_struct(&png, &info, nullptr);

  out.width = static_cast<int>(width);
  out.height = static_cast<int>(height);
  const size_t pixels = static_cast<size_t>(width) * height;
  out.rgb.resize(pixels * 3);
  if (gray16) {
    const auto* v = reinterpret_cast<const uint16_t*>(raw.data());
    for (size_t i = 0; i < pixels; ++i) {
      out.rgb[3 * i] = out.rgb[3 * i + 1] = out.rgb[3 * i + 2] =
          static_cast<uint8_t>(std::min<int>(v[i], 255));
    }
  } else if (channels <= 2) {  // gray, or gray + alpha (dropped)
    for (size_t i = 0; i < pixels; ++i) {
      out.rgb[3 * i] = out.rgb[3 * i + 1] = out.rgb[3 * i + 2] = raw[i * channels];
    }
  } else {  // RGB, or RGB + alpha (dropped)
    for (size_t i = 0; i < pixels; ++i) std::memcpy(&out.rgb[3 * i], &raw[i * channels], 3);
  }
  return true;
}

}  // namespace

ImageFormat sniff_image_format(const uint8_t* data, size_t size) {
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return ImageFormat::kJpeg;
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

ImageDecoder::ImageDecoder() : tj_(tjInitDecompress()) {}

ImageDecoder::~ImageDecoder() {
  if (tj_ != nullptr) tjDestroy(tj_);
}

bool ImageDecoder::decode(const uint8_t* data, size_t size, DecodedImage& out, std::string& error) {
  switch (sniff_image_format(data, size)) {
    case ImageFormat::kJpeg:
      return decode_jpeg(data, size, out, error);
    case ImageFormat::kPng: {
      std::vector<png_bytep> rows;
      return decode_png(data, size, scratch_, rows, out, error);
    }
    default:
      error = size == 0 ? std::string("the file is empty")
                        : fmt::format("neither JPEG nor PNG: the first bytes are {:02x}",
                                      fmt::join(data, data + std::min<size_t>(size, 8), " "));
      return false;
  }
}

bool ImageDecoder::decode_jpeg(const uint8_t* data, size_t size, DecodedImage& out,
                               std::string& error) {
  if (tj_ == nullptr) {
    error = "TurboJPEG could not start a decompressor";
    return false;
  }
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  auto* buf = const_cast<unsigned char*>(data);
  const auto len = static_cast<unsigned long>(size);
  if (tjDecompressHeader3(tj_, buf, len, &width, &height, &subsamp, &colorspace) != 0) {
    error = fmt::format("corrupt or truncated JPEG (header): {}", tjGetErrorStr2(tj_));
    return false;
  }
  const size_t pixels = static_cast<size_t>(width) * height;
  out.width = width;
  out.height = height;
  out.rgb.resize(pixels * 3);
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  // TJFLAG_STOPONWARNING: a truncated or damaged stream stops with an error instead of a
  // silently grey-padded image.
  const int flags = TJFLAG_STOPONWARNING;
  int rc;
  if (cmyk) {
    scratch_.resize(pixels * 4);
    rc = tjDecompress2(tj_, buf, len, scratch_.data(), width, 0, height, TJPF_CMYK, flags);
  } else {
    rc = tjDecompress2(tj_, buf, len, out.rgb.data(), width, 0, height, TJPF_RGB, flags);
  }
  if (rc != 0) {
    error = fmt::format("corrupt or truncated JPEG: {}", tjGetErrorStr2(tj_));
    return false;
  }
  if (cmyk) cmyk_to_rgb(scratch_.data(), out.rgb.data(), pixels);
  return true;
}

}  // namespace dlaunch::data
