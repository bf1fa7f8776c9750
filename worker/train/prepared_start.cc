#include "worker/train/prepared_start.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "worker/tensor.h"
#include "worker/train/startup_phases.h"
#include "worker/train/training_data.h"

namespace dlaunch::train {

namespace {

// Thrown by the warm-up's layer and gradient checks once the group is joined.
struct WarmUpCut {};

// One training forward and backward on zeros, the BN running statistics kept as they were, cut
// short between two layers as soon as `stop` is set: it must not delay the state exchange that
// the survivors wait in. Returns whether it ran to its end.
bool warm_up(model::ResNet& model, const TrainConfig& config, const data::ImageDataset& train_set,
             const std::atomic<bool>& stop) {
  if (stop) return false;
  kernels::Backend& backend = model.backend();
  std::vector<std::vector<float>> buffers;
  for (Tensor* t : model.buffers()) buffers.push_back(t->to_host());
  model.set_layer_check([&stop] {
    if (stop) throw WarmUpCut{};
  });
  model.set_grad_ready_callback([&stop](size_t, size_t) {
    if (stop) throw WarmUpCut{};
  });
  bool whole = true;
  try {
    Tensor images({config.batch_size, train_set.channels, train_set.height, train_set.width},
                  backend);
    images.zero();
    const Tensor& logits = model.forward(images, /*training=*/true);
    Tensor grad_logits({logits.dim(0), logits.dim(1)}, backend);
    grad_logits.zero();
    model.backward(grad_logits);
  } catch (const WarmUpCut&) {
    whole = false;
  }
  model.set_layer_check(nullptr);
  model.set_grad_ready_callback(nullptr);
  const std::vector<Tensor*> now = model.buffers();
  for (size_t i = 0; i < now.size(); ++i) now[i]->copy_from_host(buffers[i].data());
  return whole;
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
  done_ = std::async(std::launch::async, [this, &config, &env, &backend, build_model, threads] {
    kernels::set_host_threads(threads);
    PreparedStart p;
    p.splits = load_training_data(config, env, env.rank == 0);
    log_startup_phase("data ready (prepared while joining)");
    if (!build_model) return p;
    p.model = std::make_unique<model::ResNet>(resnet_config(config, p.splits.train), config.seed,
                                              backend);
    log_startup_phase("model built (prepared while joining)");
    p.warmed_up = warm_up(*p.model, config, p.splits.train, joined_);
    log_startup_phase(p.warmed_up ? "kernels warmed up (prepared while joining)"
                                  : "warm-up cut short: the group was joined");
    return p;
  });
}

void StartPreparation::joined() { joined_ = true; }

PreparedStart StartPreparation::take() {
  joined_ = true;
  return done_.get();
}

}  // namespace dlaunch::train
