#include "worker/train/recipe.h"

#include <map>

#include "common/error.h"

namespace dlaunch::train {

const std::vector<std::string>& recipe_names() {
  static const std::vector<std::string> kNames = {"none", "cifar-fast"};
  return kNames;
}

const std::vector<std::pair<std::string, std::string>>& recipe_flags(const std::string& name) {
  // cifar-fast: ResNet-18 on CIFAR-10 for time to accuracy on one GPU. The schedule, batch and
  // augmentation are KellerJordan's ResNet-18 baseline (cifar10-zoo,
  // airbench/baselines/train_resnet18_94.py: 26 epochs, batch 500, lr 0.2 on the mean loss,
  // Nesterov momentum 0.9, weight decay 5e-4, a triangle peaking at 20% of the steps, flip +
  // translate 4 + cutout 12, flip TTA); label smoothing 0.2, the alternating flip and an EMA every
  // 5 steps are airbench94's (cifar10-airbench, airbench94.py); no weight decay on BN parameters
  // and biases is the "no bias decay" of torchvision's recipes. docs/dtrain.md, Recipes, says
  // where dtrain differs from those scripts.
  static const std::map<std::string, std::vector<std::pair<std::string, std::string>>> kRecipes = {
      {"none", {}},
      {"cifar-fast",
       {{"model", "resnet18"},
        {"width", "64"},
        {"dataset", "cifar10"},
        {"epochs", "26"},
        {"batch_size", "500"},
        {"lr", "0.2"},
        {"lr_schedule", "triangle"},
        {"warmup_epochs", "20%"},
        {"momentum", "0.9"},
        {"nesterov", "true"},
        {"weight_decay", "5e-4"},
        {"no_bn_weight_decay", "true"},
        {"bn_lr_scale", "1"},
        {"label_smoothing", "0.2"},
        {"cutout", "12"},
        {"alternating_flip", "true"},
        {"tta", "flip"},
        {"ema", "0.99"},
        {"ema_every", "5"},
        {"ema_warmup", "true"}}},
  };
  auto it = kRecipes.find(name);
  DL_CHECK(it != kRecipes.end()) << "recipe " << name;
  return it->second;
}

}  // namespace dlaunch::train
