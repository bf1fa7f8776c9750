// Decodes one JPEG or PNG file held in memory to 8-bit RGB, pixel for pixel as Pillow's
// Image.open(f).convert("RGB") does (torchvision ImageFolder's default loader), so a model
// trained here sees the bytes a PyTorch user's model sees:
//   JPEG (libjpeg-turbo's TurboJPEG API, accurate DCT, fancy upsampling: libjpeg's defaults, which
//   Pillow keeps): RGB/YCbCr as decoded; grayscale replicated; CMYK/YCCK read as Adobe-inverted
//   CMYK and converted with Pillow's formula (no colour management).
//   PNG (libpng): palette looked up, alpha and tRNS dropped (not composited), gray replicated,
//   1/2/4-bit gray scaled to 0..255, 16-bit colour cut to its high byte, 16-bit gray clipped at
//   255 (Pillow opens it as mode "I" and clips on conversion).
// Thread-safe (no shared state); does not block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dlaunch::data {

enum class ImageFormat { kUnknown, kJpeg, kPng };

// By magic bytes, not by the name: a .jpg that holds a PNG still decodes.
ImageFormat sniff_image_format(const uint8_t* data, size_t size);

struct DecodedImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // height * width * 3, interleaved RGB, row-major
};

// Reuses one decoder state per thread; call from any number of threads.
class ImageDecoder {
 public:
  ImageDecoder();
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  // True and `out` filled, or false and `error` says what is wrong with the bytes (truncated,
  // corrupt, not an image). Warnings from libjpeg (a truncated file among them) count as errors:
  // Pillow refuses a truncated JPEG too.
  bool decode(const uint8_t* data, size_t size, DecodedImage& out, std::string& error);

 private:
  bool decode_jpeg(const uint8_t* data, size_t size, DecodedImage& out, std::string& error);
  void* tj_ = nullptr;  // tjhandle
  std::vector<uint8_t> scratch_;
};

}  // namespace dlaunch::data
