#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "common/log.h"
#include "worker/data/dataset.h"

namespace dlaunch::data {
namespace {

constexpr int64_t kSide = 32;
constexpr int64_t kPixels = 3 * kSide * kSide;
constexpr int64_t kRecord = 1 + kPixels;

void append_cifar_file(const std::filesystem::path& path, ImageDataset& ds) {
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  if (ec) {
    throw DataError(fmt::format("cannot read CIFAR-10 file {}: {}", path.string(), ec.message()));
  }
  if (size == 0 || size % kRecord != 0) {
    throw DataError(fmt::format(
        "CIFAR-10 file {} has {} bytes; expected a non-zero multiple of {} (1 label byte + 3072 "
        "pixel bytes per record; the original files hold 10000 records = 30730000 bytes). The "
        "file is truncated or not CIFAR-10 binary: download the 'binary version' again",
        path.string(), size, kRecord));
  }
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> raw(size);
  if (!in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(size))) {
    throw DataError(fmt::format("reading CIFAR-10 file {} failed after {} of {} bytes",
                                path.string(), in.gcount(), size));
  }
  int64_t records = static_cast<int64_t>(size) / kRecord;
  size_t base = ds.pixels.size();
  ds.pixels.resize(base + records * kPixels);
  for (int64_t r = 0; r < records; ++r) {
    const uint8_t* rec = raw.data() + r * kRecord;
    if (rec[0] >= 10) {
      throw DataError(fmt::format("CIFAR-10 file {} record {} has label {}; expected 0..9",
                                  path.string(), r, rec[0]));
    }
    ds.labels.push_back(rec[0]);
    std::copy(rec + 1, rec + kRecord, ds.pixels.begin() + base + r * kPixels);
  }
}

}  // namespace

ImageDataset load_cifar10(const std::string& dir, bool train) {
  namespace fs = std::filesystem;
  ImageDataset ds;
  ds.name = train ? "cifar10-train" : "cifar10-test";
  ds.channels = 3;
  ds.height = ds.width = kSide;
  ds.mean.assign(kCifarMean.begin(), kCifarMean.end());
  ds.stddev.assign(kCifarStd.begin(), kCifarStd.end());
  std::vector<fs::path> files;
  if (train) {
    for (int k = 1; k <= 5; ++k) {
      fs::path p = fs::path(dir) / fmt::format("data_batch_{}.bin", k);
      if (fs::exists(p)) files.push_back(p);
    }
    if (files.empty()) {
      throw DataError(fmt::format(
          "no CIFAR-10 training file in {}: expected data_batch_1.bin .. data_batch_5.bin (the "
          "'CIFAR-10 binary version'); pass --data_dir pointing at cifar-10-batches-bin",
          dir));
    }
  } else {
    fs::path p = fs::path(dir) / "test_batch.bin";
    if (!fs::exists(p)) {
      throw DataError(fmt::format(
          "CIFAR-10 test file {} is missing; expected test_batch.bin beside the data_batch_*.bin "
          "files; pass --data_dir pointing at cifar-10-batches-bin",
          p.string()));
    }
    files.push_back(p);
  }
  for (const auto& f : files) append_cifar_file(f, ds);
  log_debug("loaded {} images from {} CIFAR-10 file(s) in {}", ds.size(), files.size(), dir);
  return ds;
}

}  // namespace dlaunch::data
