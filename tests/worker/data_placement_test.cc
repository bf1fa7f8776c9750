// --data_on_device's decision (train/data_placement.h): auto keeps the data on a GPU under the
// size bound and on the host loader on the CPU; on is refused for splits that cannot be made on
// the device, naming why; off is off.
#include "worker/train/data_placement.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlaunch::train {
namespace {

data::ImageDataset split(const std::string& name, int64_t images) {
  data::ImageDataset ds;
  ds.name = name;
  ds.channels = 3;
  ds.height = ds.width = 32;
  ds.pixels.resize(static_cast<size_t>(images * ds.image_elems()));
  ds.labels.resize(static_cast<size_t>(images));
  return ds;
}

TEST(DataPlacement, AutoIsOnForAGpuUnderTheBoundAndOffAboveIt) {
  const auto train = split("train", 100), test = split("test", 28);  // 393,216 bytes
  const DataPlacement fits = choose_data_placement("auto", false, train, test, 393216);
  EXPECT_TRUE(fits.on_device);
  EXPECT_EQ(fits.reason, "--data_on_device auto: 0.4 MiB <= 0 MiB");
  const DataPlacement over = choose_data_placement("auto", false, train, test, 393215);
  EXPECT_FALSE(over.on_device);
  EXPECT_NE(over.reason.find("the splits take 0.4 MiB, above the"), std::string::npos)
      << over.reason;
  // CIFAR-10's 60,000 images fit the default bound.
  EXPECT_TRUE(
      choose_data_placement("auto", false, split("train", 50000), split("test", 10000)).on_device);
}

TEST(DataPlacement, AutoStaysOnTheHostLoaderOnTheCpuAndOnAndOffAreObeyed) {
  const auto train = split("train", 10), test = split("test", 10);
  const DataPlacement cpu = choose_data_placement("auto", true, train, test);
  EXPECT_FALSE(cpu.on_device);
  EXPECT_EQ(cpu.reason,
            "--data_on_device auto: on the CPU the loader thread overlaps with the step");
  EXPECT_TRUE(choose_data_placement("on", true, train, test).on_device);
  EXPECT_FALSE(choose_data_placement("off", false, train, test).on_device);
  // "on" ignores the bound: the user asked for it.
  EXPECT_TRUE(choose_data_placement("on", false, train, test, 1).on_device);
}

TEST(DataPlacement, SplitsThatCannotLiveOnTheDeviceAreRefusedByOnAndSkippedByAuto) {
  auto resampled = split("imagefolder-train", 4);
  resampled.stored.resize(4);
  auto encoded = split("imagefolder-test", 4);
  encoded.encoded_offsets = {0, 1, 2, 3, 4};
  const auto plain = split("plain", 4);
  try {
    choose_data_placement("on", false, resampled, plain);
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--data_on_device on needs splits decoded in memory at "
                                         "one image size, but imagefolder-train keeps its images "
                                         "at their own sizes"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(choose_data_placement("on", false, plain, encoded), UsageError);
  const DataPlacement skipped = choose_data_placement("auto", false, plain, encoded);
  EXPECT_FALSE(skipped.on_device);
  EXPECT_EQ(skipped.reason,
            "--data_on_device auto: imagefolder-test is decoded each epoch (larger than "
            "--max_decoded_mib)");
  EXPECT_FALSE(choose_data_placement("off", false, resampled, encoded).on_device);
}

}  // namespace
}  // namespace dlaunch::train
