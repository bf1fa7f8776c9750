#include "worker/train/prepared_start.h"

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "worker/tensor.h"
#include "worker/train/startup_phases.h"
#include "worker/train/training_data.h"

namespace dlaunch::train {

namespace {

// One training forward and backward on zeros, the BN running statistics kept as they were.
void warm_up(model::ResNet& model, const TrainConfig& config, const data::ImageDataset& train_set) {
  kernels::Backend& backend = model.backend();
  std::vector<std::vector<float>> buffers;
  for (Tensor* t : model.buffers()) buffers.push_back(t->to_host());
  Tensor images({config.batch_size, train_set.channels, train_set.height, train_set.width},
                backend);
  images.zero();
  const Tensor& logits = model.forward(images, /*training=*/true);
  Tensor grad_logits({logits.dim(0), logits.dim(1)}, backend);
  grad_logits.zero();
  model.backward(grad_logits);
  const std::vector<Tensor*> now = model.buffers();
  for (size_t i = 0; i < now.size(); ++i) now[i]->copy_from_host(buffers[i].data());
}

}  // namespace

model::ResNetConfig resnet_config(const TrainConfig& config, const data::ImageDataset& train_set) {
  model::ResNetConfig m;
  m.depth = config.depth();
  m.width = config.width;
  m.in_channels = static_cast<int>(train_set.channels);
  m.num_classes = static_cast<int>(train_set.num_classes);
  m.image_size = static_cast<int>(train_set.height);
  if (!kernels::parse_dtype(config.precision, &m.precision)) {
    throw UsageError(fmt::format("--precision={} is not a precision; expected fp32, bf16 or fp16",
                                 config.precision));
  }
  // auto: torchvision's stem once the images are large enough that dividing them by 4 before
  // layer1 leaves 16 pixels or more; below that the CIFAR stem keeps the resolution.
  const bool imagenet = config.stem == "imagenet" ||
                        (config.stem == "auto" &&
                         std::min(train_set.height, train_set.width) >= kImageNetStemFrom);
  m.stem = imagenet ? model::ResNetStem::kImageNet : model::ResNetStem::kCifar;
  return m;
}

StartPreparation::StartPreparation(const TrainConfig& config, const WorkerEnv& env,
                                   kernels::Backend& backend, bool build_model) {
  // OpenMP's thread count is per thread: this one's, not the library's default, so that the
  // kernels made here (and the convolution choices, keyed by it) are the training thread's.
  const int threads = kernels::host_threads();
  done_ = std::async(std::launch::async, [&config, &env, &backend, build_model, threads] {
    kernels::set_host_threads(threads);
    PreparedStart p;
    p.splits = load_training_data(config, env, env.rank == 0);
    log_startup_phase("data ready (prepared while joining)");
    if (!build_model) return p;
    p.model = std::make_unique<model::ResNet>(resnet_config(config, p.splits.train), config.seed,
                                              backend);
    log_startup_phase("model built (prepared while joining)");
    warm_up(*p.model, config, p.splits.train);
    p.warmed_up = true;
    log_startup_phase("kernels warmed up (prepared while joining)");
    return p;
  });
}

PreparedStart StartPreparation::take() { return done_.get(); }

}  // namespace dlaunch::train
