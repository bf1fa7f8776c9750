// In-memory image classification datasets: CIFAR-10 (binary), MNIST (idx, gzipped or not), image
// folders (torchvision's ImageFolder layout, as a directory or a tar archive) and a seeded
// synthetic set. Images stay as uint8 planar CHW (what the files hold: a quarter of the
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

// Where an image of a resampled dataset lies in `pixels`, and its own size.
struct StoredImage {
  int64_t offset = 0;
  int32_t height = 0, width = 0;
};

struct ImageDataset {
  std::string name;  // "cifar10-train", "mnist-test", ...
  int64_t channels = 0;
  int64_t height = 0;  // of every image, and of the batches
  int64_t width = 0;
  int64_t num_classes = 10;
  std::vector<uint8_t> pixels;  // size() * channels * height * width, planar CHW per image
  // Image folders with --image_size: when the images differ in size, or their size is not the one
  // asked for, each keeps its own size (stored[i], planar CHW at pixels[stored[i].offset]) and
  // batches get torchvision's resizing transforms (transforms.h) to height x width.
  std::vector<StoredImage> stored;
  // Image folders whose decoded images would take more than ImageFolderOptions::max_decoded_bytes:
  // the images stay encoded (their JPEG/PNG bytes back to back in `encoded`, image i at
  // [encoded_offsets[i], encoded_offsets[i + 1])) and are decoded again each epoch when a batch
  // is assembled, on `decode_threads` threads; `pixels` stays empty.
  std::vector<uint8_t> encoded;
  std::vector<int64_t> encoded_offsets;
  int decode_threads = 1;
  std::vector<uint8_t> labels;  // one per image, < num_classes
  // Per-channel mean and standard deviation on the [0, 1] scale, used to normalise.
  std::vector<float> mean;
  std::vector<float> stddev;
  // Image folders only: the class names (label i is classes[i]), where each image came from (its
  // path inside --data_dir), the bad images skipped (--skip_bad_images) and the files ignored for
  // not being .jpg/.jpeg/.png (with one example to show).
  std::vector<std::string> classes;
  std::vector<std::string> sources;
  std::vector<std::string> skipped_bad_images;
  int64_t ignored_files = 0;
  std::string ignored_example;

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  int64_t image_elems() const { return channels * height * width; }  // of a batch's image
  bool resampled() const { return !stored.empty(); }
  bool decodes_per_epoch() const { return !encoded_offsets.empty(); }
  // The decoded image; not for datasets that decode per epoch (transforms.h: image_pixels).
  const uint8_t* image(int64_t i) const {
    return pixels.data() + (resampled() ? stored[i].offset : i * image_elems());
  }
  int64_t stored_height(int64_t i) const { return resampled() ? stored[i].height : height; }
  int64_t stored_width(int64_t i) const { return resampled() ? stored[i].width : width; }
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

struct ImageFolderOptions {
  bool skip_bad_images = false;  // skip (and count) images that fail to decode, instead of stopping
  // --image_size: 0 = the images' own size (they must share one); S = S x S batches, resized by
  // torchvision's transforms unless every image already is S x S.
  int64_t image_size = 0;
  int threads = 0;               // decode threads; 0 = the machine's cores
  // Above this many bytes of decoded images (width * height * 3 summed over a split), the split
  // keeps its images encoded and decodes them per epoch (ImageDataset::encoded). 0: no limit.
  int64_t max_decoded_bytes = 0;
};

struct DatasetSplits {
  ImageDataset train;
  ImageDataset test;
};

// torchvision's ImageFolder layout in a directory or a tar archive (.tar, .tar.gz, .tgz: read in
// place): train/ and test/ (or val/), at the top or inside one top-level folder, each with one
// sub-folder per class. Classes are the sorted sub-folder names of train/ (test/ must have the
// same), labels their index; .jpg/.jpeg/.png files (any case, at any depth below the class
// folder) are images, other files are ignored and counted, and so are symlinks that lead
// nowhere (folders; those that lead to a file are followed) and symlink members (archives). Images are decoded to RGB as Pillow's
// convert("RGB") does (image_decode.h) on `threads` threads and must all be of one size unless
// options.image_size is set (then they are kept at their own sizes: ImageDataset::stored).
// Normalisation: per-channel mean and standard deviation of the training split (both splits use
// them). Throws UsageError (exit 2) for a layout problem (no train/, no test/, an empty class
// folder, or one whose images were all skipped as bad, class lists that differ, images of
// different sizes without --image_size, a path that is not a folder or a tar archive), DataError
// for images that do not decode (unless skip_bad_images: one error for both splits, with the
// count and the first 10, each with its reason) or a damaged archive: each names the file (and
// the archive member).
DatasetSplits load_image_folder(const std::string& path, const ImageFolderOptions& options);

// Per-split log lines for an image folder: the class list, images per class, totals, files
// ignored and bad images skipped.
std::vector<std::string> describe_image_folder(const DatasetSplits& splits);

// Keeps the first `n` images (n <= 0 or n >= size(): unchanged). For quick tests.
void truncate(ImageDataset& ds, int64_t n);

// Dispatch on the --dataset name (cifar10 | mnist | imagefolder | synthetic). Throws UsageError
// otherwise.
ImageDataset load_dataset(const std::string& name, const std::string& dir, bool train,
                          uint64_t seed, const ImageFolderOptions& options = {});
// Both splits; an image folder's archive is read once.
DatasetSplits load_splits(const std::string& name, const std::string& dir, uint64_t seed,
                          const ImageFolderOptions& options = {});

}  // namespace dlaunch::data
