// What a replacement rank makes ready while it joins its group. A replacement's start-up is on
// its survivors' clock (they wait for it in the state exchange, then redo the interrupted step
// with it): joining waits on the network and on the survivors, so its data, its model and its
// kernels are prepared meanwhile on another thread instead of after the join.
//
//   main:          device -> StartPreparation(...) -> join the group -> joined() -> exchange ...
//   preparing:     data (the flash directory's copy) -> model -> one forward and backward pass on
//                  a zero batch (convolution primitives made, their algorithms taken, activation
//                  memory touched), cut short between two layers at joined(): the survivors
//                  wait in the exchange, and the rest of the pass is then paid in the first step
//
// The warm-up pass leaves no trace: the BN running statistics are put back (the weights and the
// optimizer are not touched; the gradients are overwritten by every backward), so a replacement
// that finds no peer to take the state from starts exactly as a fresh worker would. Measured in
// the chaos soak (docs/benchmarks.md): a whole pass took 100-600 ms on a loaded 2-core host,
// often more than the join, and made the redone step about one undisturbed step long instead of
// 1.2-1.3; so it runs only while the join would be waited for anyway.
//
// On a GPU only the data is prepared ahead: the model and its kernels belong to the training
// thread's device context. Errors in the preparing thread reach the caller at take() (what
// load_training_data or the model throws).
#pragma once

#include <atomic>
#include <future>
#include <memory>
#include <optional>

#include "common/worker_env.h"
#include "kernels/backend.h"
#include "worker/data/dataset.h"
#include "worker/model/resnet.h"
#include "worker/train/train_config.h"

namespace dlaunch::train {

// --stem auto picks torchvision's ImageNet stem for images at least this large.
inline constexpr int64_t kImageNetStemFrom = 64;

// The model dtrain trains on `train_set` (--model, --width, --precision, --stem). Throws
// UsageError for a bad precision name (train_config checked it already).
model::ResNetConfig resnet_config(const TrainConfig& config, const data::ImageDataset& train_set);

struct PreparedStart {
  data::DatasetSplits splits;
  std::unique_ptr<model::ResNet> model;  // null: the trainer builds it (GPU)
  bool warmed_up = false;  // the warm-up pass ran to its end
};

class StartPreparation {
 public:
  // Starts preparing at once on a thread of its own. `backend` must outlive it.
  StartPreparation(const TrainConfig& config, const WorkerEnv& env, kernels::Backend& backend,
                   bool build_model);
  // The group is joined: the warm-up pass stops at its next layer.
  void joined();
  // Waits for the preparation (cutting the warm-up short); rethrows its error.
  PreparedStart take();

 private:
  std::atomic<bool> joined_{false};
  std::future<PreparedStart> done_;
};

}  // namespace dlaunch::train
