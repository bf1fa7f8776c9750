// Rank 0's record of a run in --output_dir: metrics.jsonl (kept across attempts and resumes;
// each attempt first writes where it goes on from), the TensorBoard event file mirroring it
// (--tensorboard), and curves.svg drawn from it at the end.
//
// Blocking file writes on the calling thread; errors are the metrics writers' (SystemError).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "worker/data/dataset.h"
#include "worker/metrics/metrics_log.h"
#include "worker/metrics/tensorboard_log.h"
#include "worker/train/train_config.h"

namespace dlaunch::train {

class RunMetrics {
 public:
  // Opens metrics.jsonl for attempt `restart_count`: a "data" record for image folders (what was
  // read and skipped), then the "start" record at `global_step`, then the TensorBoard file.
  void open(const TrainConfig& config, int64_t restart_count, const data::ImageDataset& train_set,
            const data::ImageDataset& test_set, int64_t global_step, int64_t epochs_done,
            int world_size);
  // One record into metrics.jsonl and, as written there, into the TensorBoard file.
  void record(const nlohmann::json& record);
  // After the last epoch: curves.svg from every record of the run; logs both files.
  void draw_curves(const TrainConfig& config, int world_size);

 private:
  std::unique_ptr<metrics::MetricsLog> log_;
  std::unique_ptr<metrics::TensorBoardLog> tensorboard_;  // null with --tensorboard=false
};

}  // namespace dlaunch::train
