// What a dtrain checkpoint's meta records of the run that wrote it, and how a run that would
// continue it compares: the model signature (whatever fixes the arrays' shapes and what the
// weights mean), the flags (for reproducing a run) and the settings that keep a checkpoint from
// being continued. Pure functions, no I/O.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/data/dataset.h"
#include "worker/model/resnet.h"
#include "worker/train/train_config.h"

namespace dlaunch::train {

// What must match between a checkpoint and the run resuming from it (meta "signature").
nlohmann::json model_signature(const TrainConfig& config, const data::ImageDataset& train_set,
                               const model::ResNetConfig& model_config);

// The run's flags as the checkpoint records them (meta "config").
nlohmann::json config_json(const TrainConfig& config);

// Every setting that keeps a checkpoint (its `meta`) from being continued by this run, named as
// the flag a user changes, joined by "; " ("" when none). `want` is this run's model_signature().
std::string incompatible_settings(const nlohmann::json& meta, const TrainConfig& config,
                                  const nlohmann::json& want);

}  // namespace dlaunch::train
