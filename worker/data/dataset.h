// In-memory image classification datasets: CIFAR-10 (binary), MNIST (idx, gzipped or not) and a
// seeded synthetic set. Images stay as uint8 planar CHW (what the files hold: a quarter of the
// memory of floats); normalisation and augmentation happen when a batch is assembled
// (batch_loader.h), so every worker keeps one copy of the raw bytes.
//
// Loaders block on file I/O and throw DataError (a dlaunch::Error) naming the file, what was
// expected and what was found.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"

namespace dlaunch::data {

class DataError : public Error {
 public:
  using Error::Error;
};

struct ImageDataset {
  std::string name;  // "cifar10-train", "mnist-test", ...
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t num_classes = 10;
  std::vector<uint8_t> pixels;  // size() * channels * height * width, planar CHW per image
  std::vector<uint8_t> labels;  // one per image, < num_classes
  // Per-channel mean and standard deviation on the [0, 1] scale, used to normalise.
  std::vector<float> mean;
  std::vector<float> stddev;

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  int64_t image_elems() const { return channels * height * width; }
  const uint8_t* image(int64_t i) const { return pixels.data() + i * image_elems(); }
};

// The standard normalisation constants (torchvision recipes).
inline constexpr std::array<float, 3> kCifarMean = {0.4914f, 0.4822f, 0.4465f};
inline constexpr std::array<float, 3> kCifarStd = {0.2470f, 0.2435f, 0.2616f};
inline constexpr float kMnistMean = 0.1307f;
inline constexpr float kMnistStd = 0.3081f;

// CIFAR-10 binary: train = every data_batch_<k>.bin present in `dir` (k = 1..5, in order; at least
// one), test = test_batch.bin. Each record is 1 label byte + 3072 pixel bytes.
ImageDataset load_cifar10(const std::string& dir, bool train);

// MNIST idx: {train,t10k}-{images-idx3,labels-idx1}-ubyte, with or without ".gz".
ImageDataset load_mnist(const std::string& dir, bool train);

// 3x32x32, 10 classes, 5000 train / 1000 test images; deterministic for a seed. Each class is a
// smooth random template (low-frequency colour blobs), each image the template shifted by up to
// 2 pixels, scaled in contrast and covered with per-pixel noise: learnable, but not on sight.
ImageDataset make_synthetic(uint64_t seed, bool train);

// Keeps the first `n` images (n <= 0 or n >= size(): unchanged). For quick tests.
void truncate(ImageDataset& ds, int64_t n);

// Dispatch on the --dataset name (cifar10 | mnist | synthetic). Throws UsageError otherwise.
ImageDataset load_dataset(const std::string& name, const std::string& dir, bool train,
                          uint64_t seed);

}  // namespace dlaunch::data
