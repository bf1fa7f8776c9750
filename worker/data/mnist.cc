#include <fmt/format.h>
#include <zlib.h>

#include <filesystem>

#include "worker/data/dataset.h"

namespace dlaunch::data {
namespace {

// gzread reads plain files transparently, so one path handles both spellings.
std::vector<uint8_t> read_maybe_gzipped(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw DataError(fmt::format("cannot open MNIST file {}", path));
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  while (true) {
    int n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      throw DataError(fmt::format(
          "MNIST file {} is corrupt ({}); download it again from the original idx archive", path,
          msg));
    }
    if (n == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
  }
  gzclose(f);
  return out;
}

uint32_t be32(const std::vector<uint8_t>& b, size_t off) {
  return (uint32_t{b[off]} << 24) | (uint32_t{b[off + 1]} << 16) | (uint32_t{b[off + 2]} << 8) |
         uint32_t{b[off + 3]};
}

std::string find_file(const std::string& dir, const std::string& base) {
  namespace fs = std::filesystem;
  for (const char* suffix : {"", ".gz"}) {
    fs::path p = fs::path(dir) / (base + suffix);
    if (fs::exists(p)) return p.string();
  }
  throw DataError(fmt::format(
      "MNIST file {} (or {}.gz) is missing in {}; expected the four idx files "
      "(train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
      "t10k-labels-idx1-ubyte); pass --data_dir pointing at them",
      base, base, dir));
}

}  // namespace

ImageDataset load_mnist(const std::string& dir, bool train) {
  std::string prefix = train ? "train" : "t10k";
  std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  std::vector<uint8_t> images = read_maybe_gzipped(images_path);
  std::vector<uint8_t> labels = read_maybe_gzipped(labels_path);

  if (images.size() < 16 || be32(images, 0) != 0x00000803) {
    throw DataError(fmt::format(
        "{} is not an MNIST image file: expected magic 0x00000803 (2051) in a 16-byte header, "
        "found {}",
        images_path,
        images.size() < 4 ? std::string("a file of ") + std::to_string(images.size()) + " bytes"
                          : fmt::format("0x{:08x}", be32(images, 0))));
  }
  if (labels.size() < 8 || be32(labels, 0) != 0x00000801) {
    throw DataError(fmt::format(
        "{} is not an MNIST label file: expected magic 0x00000801 (2049) in an 8-byte header, "
        "found {}",
        labels_path,
        labels.size() < 4 ? std::string("a file of ") + std::to_string(labels.size()) + " bytes"
                          : fmt::format("0x{:08x}", be32(labels, 0))));
  }
  uint64_t n = be32(images, 4), rows = be32(images, 8), cols = be32(images, 12);
  uint64_t nl = be32(labels, 4);
  if (n != nl) {
    throw DataError(fmt::format("{} holds {} images but {} holds {} labels; expected equal counts",
                                images_path, n, labels_path, nl));
  }
  if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096) {
    throw DataError(fmt::format("{} declares {}x{} images; expected 28x28", images_path, rows, cols));
  }
  if (images.size() != 16 + n * rows * cols) {
    throw DataError(fmt::format("{} has {} bytes; its header ({} images of {}x{}) needs {}: the file "
                                "is truncated or corrupt",
                                images_path, images.size(), n, rows, cols, 16 + n * rows * cols));
  }
  if (labels.size() != 8 + nl) {
    throw DataError(fmt::format("{} has {} bytes; its header ({} labels) needs {}: the file is "
                                "truncated or corrupt",
                                labels_path, labels.size(), nl, 8 + nl));
  }
  ImageDataset ds;
  ds.name = train ? "mnist-train" : "mnist-test";
  ds.channels = 1;
  ds.height = static_cast<int64_t>(rows);
  ds.width = static_cast<int64_t>(cols);
  ds.mean = {kMnistMean};
  ds.stddev = {kMnistStd};
  ds.pixels.assign(images.begin() + 16, images.end());
  ds.labels.assign(labels.begin() + 8, labels.end());
  for (size_t i = 0; i < ds.labels.size(); ++i) {
    if (ds.labels[i] >= 10) {
      throw DataError(
          fmt::format("{} label {} is {}; expected 0..9", labels_path, i, ds.labels[i]));
    }
  }
  return ds;
}

}  // namespace dlaunch::data
