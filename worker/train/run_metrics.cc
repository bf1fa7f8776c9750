#include "worker/train/run_metrics.h"

#include <fmt/format.h>

#include <filesystem>

#include "common/log.h"
#include "worker/metrics/svg_plot.h"

namespace dlaunch::train {
namespace fs = std::filesystem;
using nlohmann::json;

void RunMetrics::open(const TrainConfig& config, int64_t restart_count,
                      const data::ImageDataset& train_set, const data::ImageDataset& test_set,
                      int64_t global_step, int64_t epochs_done, int world_size) {
  log_ = std::make_unique<metrics::MetricsLog>(
      (fs::path(config.output_dir) / "metrics.jsonl").string(), restart_count);
  if (config.dataset == "imagefolder") {
    // What was read, for a later look at a run: the bad images skipped are named here too.
    json skipped = json::array();
    for (const auto* ds : {&train_set, &test_set}) {
      for (const auto& f : ds->skipped_bad_images) skipped.push_back(f);
    }
    log_->write({{"kind", "data"},
                 {"data_dir", config.data_dir},
                 {"classes", train_set.classes},
                 {"train_images", train_set.size()},
                 {"test_images", test_set.size()},
                 {"ignored_files", train_set.ignored_files + test_set.ignored_files},
                 {"skipped_bad_images", skipped.size()},
                 {"skipped_bad_image_files", skipped}});
  }
  // Where this run or attempt goes on from: the records after this step written before it are
  // of steps lost and redone now (the plot drops them: svg_plot.h).
  log_->write({{"kind", "start"},
               {"step", global_step},
               {"epochs_done", epochs_done},
               {"world_size", world_size}});
  // After the start record: the history it is rebuilt from then leaves out the steps redone now.
  if (config.tensorboard) {
    tensorboard_ = std::make_unique<metrics::TensorBoardLog>(
        config.output_dir, metrics::surviving_records(metrics::read_metrics(log_->path())));
  }
}

void RunMetrics::record(const json& record) {
  const json written = log_->write(record);
  if (tensorboard_) tensorboard_->write(written);
}

void RunMetrics::draw_curves(const TrainConfig& config, int world_size) {
  std::string svg = (fs::path(config.output_dir) / "curves.svg").string();
  metrics::write_curves_svg(svg, metrics::read_metrics(log_->path()),
                            fmt::format("dtrain resnet{} width {} on {}, {} worker(s)",
                                        config.depth(), config.width, config.dataset, world_size));
  log_info("wrote {} and {}", log_->path(), svg);
}

}  // namespace dlaunch::train
