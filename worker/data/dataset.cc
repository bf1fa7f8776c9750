#include "worker/data/dataset.h"

#include <fmt/format.h>

namespace dlaunch::data {

void truncate(ImageDataset& ds, int64_t n) {
  if (n <= 0 || n >= ds.size()) return;
  ds.labels.resize(n);
  ds.pixels.resize(n * ds.image_elems());
}

ImageDataset load_dataset(const std::string& name, const std::string& dir, bool train,
                          uint64_t seed) {
  if (name == "cifar10") return load_cifar10(dir, train);
  if (name == "mnist") return load_mnist(dir, train);
  if (name == "synthetic") return make_synthetic(seed, train);
  throw UsageError(fmt::format("--dataset={} is unknown; expected cifar10, mnist or synthetic", name));
}

}  // namespace dlaunch::data
