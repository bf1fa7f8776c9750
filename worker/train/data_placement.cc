#include "worker/train/data_placement.h"

#include <fmt/format.h>

#include "common/error.h"
#include "kernels/augment.h"

namespace dlaunch::train {
namespace {

// Why `ds` cannot be kept on the device ("" when it can).
std::string unfit_for_device(const data::ImageDataset& ds) {
  if (ds.resampled())
    return fmt::format(
        "{} keeps its images at their own sizes (--image_size resamples them per "
        "batch on the host)",
        ds.name);
  if (ds.decodes_per_epoch())
    return fmt::format("{} is decoded each epoch (larger than --max_decoded_mib)", ds.name);
  if (ds.channels > kernels::kMaxAugmentChannels)
    return fmt::format("{} has {} channels, more than the {} the device transform takes", ds.name,
                       ds.channels, kernels::kMaxAugmentChannels);
  return "";
}

}  // namespace

DataPlacement choose_data_placement(const std::string& mode, bool host_device,
                                    const data::ImageDataset& train, const data::ImageDataset& test,
                                    int64_t max_bytes) {
  if (mode == "off") return {false, "--data_on_device off"};
  std::string unfit = unfit_for_device(train);
  if (unfit.empty()) unfit = unfit_for_device(test);
  if (!unfit.empty()) {
    if (mode == "on") {
      throw UsageError(
          fmt::format("--data_on_device on needs splits decoded in memory at one image "
                      "size, but {}; use --data_on_device auto or off",
                      unfit));
    }
    return {false, "--data_on_device auto: " + unfit};
  }
  const double mib = static_cast<double>(train.pixels.size() + test.pixels.size()) / (1 << 20);
  if (mode == "on") return {true, fmt::format("--data_on_device on: {:.1f} MiB", mib)};
  if (host_device) {
    return {false, "--data_on_device auto: on the CPU the loader thread overlaps with the step"};
  }
  const double bound = static_cast<double>(max_bytes) / (1 << 20);
  if (static_cast<int64_t>(train.pixels.size() + test.pixels.size()) > max_bytes) {
    return {false, fmt::format("--data_on_device auto: the splits take {:.1f} MiB, above the "
                               "{:.0f} MiB bound",
                               mib, bound)};
  }
  return {true, fmt::format("--data_on_device auto: {:.1f} MiB <= {:.0f} MiB", mib, bound)};
}

}  // namespace dlaunch::train
