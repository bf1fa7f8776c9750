#include "worker/train/checkpoint_meta.h"

#include <fmt/format.h>

namespace dlaunch::train {
using nlohmann::json;

namespace {

// "" when the checkpoint's class list is `ours` (or it has none: not an image folder run), else
// the first difference.
std::string class_list_difference(const json& have, const std::vector<std::string>& ours) {
  if (!have.contains("classes") && ours.empty()) return "";
  const std::vector<std::string> theirs = have.contains("classes")
                                              ? have["classes"].get<std::vector<std::string>>()
                                              : std::vector<std::string>();
  if (theirs == ours) return "";
  size_t i = 0;
  while (i < theirs.size() && i < ours.size() && theirs[i] == ours[i]) ++i;
  auto at = [&](const std::vector<std::string>& v) {
    return i < v.size() ? fmt::format("'{}'", v[i]) : std::string("nothing");
  };
  return fmt::format(
      "the class list (sorted sub-folders of train/) is {} classes in the checkpoint "
      "but {} here, first differing at label {}: {} there, {} here",
      theirs.size(), ours.size(), i, at(theirs), at(ours));
}

}  // namespace

// The stem changes the first layer's shape; the image size leaves every shape alone (global
// pooling) but not what the weights have learnt, so resuming at another size would train on
// quietly.
json model_signature(const TrainConfig& config, const data::ImageDataset& train_set,
                     const model::ResNetConfig& model_config) {
  json sig = {{"model", config.model},
              {"width", config.width},
              {"dataset", config.dataset},
              {"in_channels", train_set.channels},
              {"num_classes", train_set.num_classes},
              {"optimizer", config.optimizer},
              // SGD keeps momentum buffers only when --momentum is non-zero: resuming across
              // that change would hand the optimizer a state of the wrong size.
              {"momentum_buffers", config.optimizer != "sgd" || config.momentum != 0},
              {"stem", model::stem_name(model_config.stem)},
              {"image_size", fmt::format("{}x{}", train_set.height, train_set.width)}};
  // Image folders: the class names fix what each label means. Another class list (a folder
  // added, renamed or missing) changes that even where the number of classes stays.
  if (!train_set.classes.empty()) sig["classes"] = train_set.classes;
  return sig;
}

json config_json(const TrainConfig& config) {
  return {{"model", config.model},
          {"width", config.width},
          {"dataset", config.dataset},
          {"epochs", config.epochs},
          {"batch_size", config.batch_size},
          {"lr", config.lr},
          {"lr_schedule", config.lr_schedule},
          {"warmup_epochs", config.warmup_epochs},
          {"optimizer", config.optimizer},
          {"momentum", config.momentum},
          {"nesterov", config.nesterov},
          {"weight_decay", config.weight_decay},
          {"scale_lr", config.scale_lr},
          {"sync_bn", config.sync_bn},
          {"seed", config.seed},
          {"augment", config.augment()},
          {"precision", config.precision},
          // The fast recipe's options, recorded so a run can be reproduced; a resume may change
          // them, as it may change --lr.
          {"no_bn_weight_decay", config.no_bn_weight_decay},
          {"bn_lr_scale", config.bn_lr_scale},
          {"label_smoothing", config.label_smoothing},
          {"cutout", config.cutout},
          {"alternating_flip", config.alternating_flip},
          {"tta", config.tta},
          {"ema", config.ema},
          {"ema_every", config.ema_every},
          {"ema_warmup", config.ema_warmup},
          {"recipe", config.recipe}};
}

// The model signature and the seed (the seed fixes the synthetic data, the sampler's order and
// the augmentation, so a run resumed with another seed is not the run that was checkpointed).
std::string incompatible_settings(const json& meta, const TrainConfig& config, const json& want) {
  struct Setting {
    std::string key, what;
    // What a checkpoint written before the key was recorded had: null compares as "absent",
    // and `skip_when_absent` leaves a setting that was never recorded unchecked.
    json assumed;
    bool skip_when_absent = false;
  };
  static const std::vector<Setting> kSettings = {
      {"model", "--model"},
      {"width", "--width"},
      {"dataset", "--dataset"},
      {"in_channels", "the dataset's image channels"},
      {"num_classes", "the dataset's number of classes"},
      {"optimizer", "--optimizer"},
      {"momentum_buffers", "SGD momentum buffers (--momentum zero or not)"},
      // A checkpoint that does not record its stem was written with the CIFAR stem.
      {"stem", "the ResNet stem (--stem; auto takes imagenet for images of 64 pixels and more)",
       "cifar"},
      // Unknown for older checkpoints; the shapes do not depend on it, so they still load.
      {"image_size", "the image size (--image_size, else the images' own size)", json(), true}};
  const json have = meta.value("signature", json::object());
  std::string out;
  auto text = [](const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
  auto add = [&](const std::string& what, const std::string& theirs, const json& ours) {
    out += fmt::format("{}{} is {} in the checkpoint but {} here", out.empty() ? "" : "; ", what,
                       theirs, text(ours));
  };
  for (const auto& s : kSettings) {
    const bool recorded = have.contains(s.key);
    if (!recorded && s.skip_when_absent) continue;
    const json theirs = recorded ? have[s.key] : s.assumed;
    if (theirs == want[s.key]) continue;
    std::string shown = text(theirs);
    if (!recorded) {
      shown = theirs.is_null()
                  ? "absent"
                  : shown + " (assumed: the checkpoint is older than dtrain recording it)";
    }
    add(s.what, shown, want[s.key]);
  }
  const json recorded_config = meta.value("config", json::object());
  if (recorded_config.contains("seed") && recorded_config["seed"] != json(config.seed)) {
    add("--seed", text(recorded_config["seed"]), json(config.seed));
  }
  const std::string classes = class_list_difference(
      have, want.contains("classes") ? want["classes"].get<std::vector<std::string>>()
                                     : std::vector<std::string>());
  if (!classes.empty()) out += (out.empty() ? "" : "; ") + classes;
  return out;
}

}  // namespace dlaunch::train
