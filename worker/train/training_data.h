// The training and test splits of --dataset as this rank trains on them: read and decoded (or
// taken from the split cache an earlier attempt of this worker left in the flash directory),
// then cut to --limit_train_samples / --limit_test_samples. Rank 0 logs what was read.
//
// Blocks for the reading and decoding (decode threads: kernels::host_threads()). Throws
// UsageError (--image_size with a dataset of fixed-size images) and data::DataError (a bad data
// directory or image).
#pragma once

#include "common/worker_env.h"
#include "worker/data/dataset.h"
#include "worker/train/train_config.h"

namespace dlaunch::train {

data::DatasetSplits load_training_data(const TrainConfig& config, const WorkerEnv& env, bool rank0);

}  // namespace dlaunch::train
