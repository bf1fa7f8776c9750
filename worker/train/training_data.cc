#include "worker/train/training_data.h"

#include <fmt/format.h>

#include <chrono>
#include <optional>

#include "common/error.h"
#include "common/log.h"
#include "kernels/backend.h"
#include "worker/data/split_cache.h"
#include "worker/data/transforms.h"

namespace dlaunch::train {

namespace {

// Rank 0: how an image folder was read, and for each split kept encoded or resampled, how it is
// decoded each epoch.
void log_image_folder(const TrainConfig& config, const data::DatasetSplits& splits, int threads,
                      double seconds) {
  log_info(
      "data: imagefolder {}: decoded {} + {} images in {:.2f} s on {} threads, kept "
      "decoded in memory (uint8): {:.1f} MiB",
      config.data_dir, splits.train.size(), splits.test.size(), seconds, threads,
      static_cast<double>(splits.train.pixels.size() + splits.test.pixels.size()) / (1 << 20));
  for (const data::ImageDataset* ds : {&splits.train, &splits.test}) {
    if (ds->decodes_per_epoch()) {
      // The bound: the encoded bytes, plus the batches in flight (the one being assembled and
      // BatchLoader's two ahead) as floats, plus a decoded image per decode thread.
      const double batches = 3.0 * config.batch_size * ds->image_elems() * sizeof(float);
      log_info(
          "data: {}: decoded it would take more than --max_decoded_mib={}: kept encoded "
          "({:.1f} MiB) and decoded each epoch by {} loader threads; memory bound {:.1f} "
          "MiB plus one decoded image per thread",
          ds->name, config.max_decoded_mib, static_cast<double>(ds->encoded.size()) / (1 << 20),
          ds->decode_threads, (static_cast<double>(ds->encoded.size()) + batches) / (1 << 20));
    }
    if (ds->resampled()) {
      log_info("data: {}: images of their own sizes, {} to {}x{} (--image_size)", ds->name,
               ds == &splits.train && config.augment()
                   ? "RandomResizedCrop(scale 0.08-1, ratio 3/4-4/3) + flip"
                   : fmt::format("Resize({}) + CenterCrop", data::eval_resize_size(ds->height)),
               ds->width, ds->height);
    }
  }
  for (const std::string& line : data::describe_image_folder(splits)) log_info("data: {}", line);
}

}  // namespace

data::DatasetSplits load_training_data(const TrainConfig& config, const WorkerEnv& env,
                                       bool rank0) {
  data::ImageFolderOptions folder;
  folder.skip_bad_images = config.skip_bad_images;
  folder.threads = kernels::host_threads();
  folder.image_size = config.image_size;
  folder.max_decoded_bytes = config.max_decoded_mib << 20;
  if (config.image_size > 0 && config.dataset != "imagefolder") {
    throw UsageError(
        fmt::format("--image_size={} applies to --dataset=imagefolder only, not "
                    "--dataset={} (whose images have a fixed size); drop it",
                    config.image_size, config.dataset));
  }
  const auto start = std::chrono::steady_clock::now();
  // A worker restarted by dlaunch finds the data its predecessor loaded in the flash directory.
  const std::string cache_dir = config.flash_every > 0 ? env.flash_dir : std::string();
  const std::string cache_key =
      data::split_cache_key(config.dataset, config.data_dir, config.seed, folder);
  std::optional<data::DatasetSplits> cached;
  if (!cache_dir.empty()) cached = data::read_split_cache(cache_dir, cache_key);
  data::DatasetSplits splits =
      cached ? std::move(*cached)
             : data::load_splits(config.dataset, config.data_dir, config.seed, folder);
  // Sets decoded per epoch are too large to copy into the flash directory.
  if (!cache_dir.empty() && !cached && env.local_rank == 0 && !splits.train.decodes_per_epoch() &&
      !splits.test.decodes_per_epoch()) {
    data::write_split_cache(cache_dir, cache_key, splits);
  }
  if (cached && rank0)
    log_info("data: taken from the flash directory (loaded by an earlier attempt)");
  if (rank0 && config.dataset == "imagefolder") {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    log_image_folder(config, splits, folder.threads, seconds);
  }
  data::truncate(splits.train, config.limit_train_samples);
  data::truncate(splits.test, config.limit_test_samples);
  if (rank0) {
    log_info("data: {} ({} images) / {} ({} images), {}x{}x{}, augmentation {}", splits.train.name,
             splits.train.size(), splits.test.name, splits.test.size(), splits.train.channels,
             splits.train.height, splits.train.width, config.augment() ? "on" : "off");
  }
  return splits;
}

}  // namespace dlaunch::train
