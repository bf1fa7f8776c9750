#include "worker/data/dataset.h"

#include <fmt/format.h>

namespace dlaunch::data {

void truncate(ImageDataset& ds, int64_t n) {
  if (n <= 0 || n >= ds.size()) return;
  ds.labels.resize(n);
  if (ds.decodes_per_epoch()) {
    ds.encoded.resize(ds.encoded_offsets[n]);
    ds.encoded_offsets.resize(n + 1);
  } else {
    ds.pixels.resize(ds.resampled() ? ds.stored[n].offset : n * ds.image_elems());
  }
  if (ds.resampled()) ds.stored.resize(n);
  if (static_cast<int64_t>(ds.sources.size()) > n) ds.sources.resize(n);
}

ImageDataset load_dataset(const std::string& name, const std::string& dir, bool train,
                          uint64_t seed, const ImageFolderOptions& options) {
  if (name == "cifar10") return load_cifar10(dir, train);
  if (name == "mnist") return load_mnist(dir, train);
  if (name == "synthetic") return make_synthetic(seed, train);
  if (name == "imagefolder") {
    DatasetSplits s = load_image_folder(dir, options);
    return train ? std::move(s.train) : std::move(s.test);
  }
  throw UsageError(fmt::format("--dataset={} is unknown; expected cifar10, mnist, imagefolder or "
                               "synthetic",
                               name));
}

DatasetSplits load_splits(const std::string& name, const std::string& dir, uint64_t seed,
                          const ImageFolderOptions& options) {
  if (name == "imagefolder") return load_image_folder(dir, options);
  return {load_dataset(name, dir, true, seed, options), load_dataset(name, dir, false, seed, options)};
}

}  // namespace dlaunch::data
