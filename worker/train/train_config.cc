#include "worker/train/train_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>

#include "common/env.h"
#include "common/error.h"
#include "common/suggest.h"
#include "worker/train/recipe.h"

namespace dlaunch::train {
namespace {

struct Flag {
  const char* name;
  const char* help;
  bool boolean;
  std::function<void(TrainConfig&, const std::string& flag, const std::string& value)> set;
  std::function<std::string(const TrainConfig&)> show;
};

std::string choice(const std::string& flag, const std::string& value,
                   const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    throw UsageError(fmt::format("{}={} is not allowed; expected one of: {}", flag, value, list));
  }
  return value;
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// Where a numeric flag's value may lie: [min, max], an end excluded where said. The one parser of
// every numeric flag below (number_flag, integer_flag), so each refusal names the bound it
// crossed and what the flag takes.
struct Bounds {
  double min = 0;
  double max = kInf;
  bool min_excluded = false;  // the value must be above min
  bool max_excluded = false;  // the value must be below max
  bool infinity_allowed = false;  // +inf means something for this flag (--lr inf)
};

std::string bound_text(double bound) { return fmt::format("{}", bound); }

// Throws the refusal of `v` (already a number) when it is outside `b`; `expected` says what the
// flag takes ("a learning rate >= 0").
void check_bounds(const std::string& flag, const std::string& value, double v, const Bounds& b,
                  const std::string& expected) {
  std::string why;
  if (std::isnan(v)) {
    why = "is not a number";
  } else if (std::isinf(v) && !(v > 0 && b.infinity_allowed)) {
    why = "is not finite";
  } else if (v < b.min || (b.min_excluded && v == b.min)) {
    why = b.min_excluded ? "is not above " + bound_text(b.min) : "is below " + bound_text(b.min);
  } else if (v > b.max || (b.max_excluded && v == b.max)) {
    why = b.max_excluded ? "is not below " + bound_text(b.max) : "is above " + bound_text(b.max);
  }
  if (!why.empty()) throw UsageError(fmt::format("{}={} {}; expected {}", flag, value, why, expected));
}

double number_flag(const std::string& flag, const std::string& value, const Bounds& b,
                   const std::string& expected) {
  const double v = parse_double(value, flag);
  check_bounds(flag, value, v, b, expected);
  return v;
}

int64_t integer_flag(const std::string& flag, const std::string& value, int64_t min, int64_t max,
                     const std::string& expected) {
  const int64_t v = parse_int(value, flag);
  Bounds b;
  b.min = static_cast<double>(min);
  b.max = static_cast<double>(max);
  if (v < min || v > max) check_bounds(flag, value, static_cast<double>(v), b, expected);
  return v;
}

// The counts (epochs, steps, widths, ...) that fit an int and stay far from overflowing products.
constexpr int64_t kMaxCount = 1'000'000'000;

int positive_int(const std::string& flag, const std::string& value, int min) {
  return static_cast<int>(integer_flag(
      flag, value, min, kMaxCount, fmt::format("an integer from {} to {}", min, kMaxCount)));
}

// A number >= 0 that must be finite: the optimizer's and the schedule's settings.
double nonneg_double(const std::string& flag, const std::string& value) {
  return number_flag(flag, value, Bounds{}, "a finite number >= 0");
}

// A rate in [0, 1) where 0 turns the option off (--ema's decay, --label_smoothing's EPS).
double rate_below_one(const std::string& flag, const std::string& value, const char* expected) {
  Bounds b;
  b.max = 1;
  b.max_excluded = true;
  return number_flag(flag, value, b, fmt::format("{} (0: off)", expected));
}

std::string fmt_bool(bool b) { return b ? "true" : "false"; }
std::string fmt_double(double d) { return fmt::format("{}", d); }

const std::vector<Flag>& flags() {
  static const std::vector<Flag> kFlags = {
      {"recipe",
       "a preset of the flags below, applied first so explicit flags override it: none | "
       "cifar-fast (ResNet-18 on CIFAR-10 for time to accuracy on one GPU; docs/dtrain.md, "
       "Recipes)",
       false, [](TrainConfig& c, auto& f, auto& v) { c.recipe = choice(f, v, recipe_names()); },
       [](const TrainConfig& c) { return c.recipe; }},
      {"model", "network: resnet18 | resnet34 (the first layer: --stem)", false,
       [](TrainConfig& c, auto& f, auto& v) { c.model = choice(f, v, {"resnet18", "resnet34"}); },
       [](const TrainConfig& c) { return c.model; }},
      {"width", "base channels (layer widths w, 2w, 4w, 8w)", false,
       [](TrainConfig& c, auto& f, auto& v) { c.width = positive_int(f, v, 1); },
       [](const TrainConfig& c) { return std::to_string(c.width); }},
      {"dataset",
       "cifar10 | mnist | imagefolder (class folders of JPEG/PNG, or a tar of them) | synthetic "
       "(5000/1000 generated 32x32 images, no files)",
       false,
       [](TrainConfig& c, auto& f, auto& v) {
         c.dataset = choice(f, v, {"cifar10", "mnist", "imagefolder", "synthetic"});
       },
       [](const TrainConfig& c) { return c.dataset; }},
      {"data_dir",
       "directory with the dataset files (cifar-10-batches-bin, the MNIST idx files, or for "
       "imagefolder a folder or .tar/.tar.gz/.tgz holding train/ and test/)",
       false,
       [](TrainConfig& c, auto&, auto& v) {
         c.data_dir = v;
         c.data_dir_given = true;
       },
       [](const TrainConfig& c) { return c.data_dir; }},
      {"epochs", "epochs to train", false,
       [](TrainConfig& c, auto& f, auto& v) { c.epochs = positive_int(f, v, 1); },
       [](const TrainConfig& c) { return std::to_string(c.epochs); }},
      {"batch_size", "images per worker per step", false,
       [](TrainConfig& c, auto& f, auto& v) { c.batch_size = positive_int(f, v, 1); },
       [](const TrainConfig& c) { return std::to_string(c.batch_size); }},
      {"lr", "base learning rate", false,
       [](TrainConfig& c, auto& f, auto& v) {
         Bounds b;
         b.infinity_allowed = true;  // it diverges at once, and dtrain stops on that
         c.lr = number_flag(f, v, b, "a learning rate >= 0");
       },
       [](const TrainConfig& c) { return fmt_double(c.lr); }},
      {"lr_schedule",
       "cosine | step (x0.1 every 30 epochs) | constant | triangle (after the warm-up, linear "
       "down to 0 at the last epoch)",
       false,
       [](TrainConfig& c, auto& f, auto& v) {
         c.lr_schedule = choice(f, v, {"cosine", "step", "constant", "triangle"});
       },
       [](const TrainConfig& c) { return c.lr_schedule; }},
      {"warmup_epochs", "linear warm-up from 0 over this many epochs, or P% of --epochs", false,
       [](TrainConfig& c, auto& f, auto& v) {
         const bool percent = !v.empty() && v.back() == '%';
         Bounds b;
         if (percent) {
           b.max = 100;
           b.max_excluded = true;
         }
         const double x = parse_double(percent ? v.substr(0, v.size() - 1) : v, f);
         check_bounds(f, v, x, b,
                      percent ? "a share of --epochs in [0%, 100%), e.g. 20%"
                              : "a number of epochs >= 0, or P% of --epochs");
         c.warmup_epochs = percent ? 0 : x;
         c.warmup_percent = percent ? x : -1;
       },
       [](const TrainConfig& c) {
         return c.warmup_percent >= 0 ? fmt_double(c.warmup_percent) + "%" : fmt_double(c.warmup_epochs);
       }},
      {"optimizer", "sgd | adam", false,
       [](TrainConfig& c, auto& f, auto& v) { c.optimizer = choice(f, v, {"sgd", "adam"}); },
       [](const TrainConfig& c) { return c.optimizer; }},
      {"momentum", "SGD momentum", false,
       [](TrainConfig& c, auto& f, auto& v) { c.momentum = nonneg_double(f, v); },
       [](const TrainConfig& c) { return fmt_double(c.momentum); }},
      {"nesterov", "Nesterov momentum (SGD)", true,
       [](TrainConfig& c, auto& f, auto& v) { c.nesterov = parse_bool(v, f); },
       [](const TrainConfig& c) { return fmt_bool(c.nesterov); }},
      {"weight_decay", "L2 penalty added to the gradient (PyTorch's weight_decay)", false,
       [](TrainConfig& c, auto& f, auto& v) { c.weight_decay = nonneg_double(f, v); },
       [](const TrainConfig& c) { return fmt_double(c.weight_decay); }},
      {"no_bn_weight_decay",
       "no weight decay for batch norm weights and biases and the classifier's bias (as "
       "torchvision's recipes' norm_weight_decay=0)",
       true, [](TrainConfig& c, auto& f, auto& v) { c.no_bn_weight_decay = parse_bool(v, f); },
       [](const TrainConfig& c) { return fmt_bool(c.no_bn_weight_decay); }},
      {"bn_lr_scale", "learning rate of batch norm weights and biases = the schedule's x K", false,
       [](TrainConfig& c, auto& f, auto& v) { c.bn_lr_scale = nonneg_double(f, v); },
       [](const TrainConfig& c) { return fmt_double(c.bn_lr_scale); }},
      {"cutout",
       "training augmentation: set a random SIZE x SIZE square of each image, wholly inside it, "
       "to the mean pixel (airbench's cutout; 0: off)",
       false, [](TrainConfig& c, auto& f, auto& v) { c.cutout = positive_int(f, v, 0); },
       [](const TrainConfig& c) { return std::to_string(c.cutout); }},
      {"alternating_flip",
       "training augmentation: flip each image by a coin drawn once per run and invert it every "
       "other epoch (airbench), instead of a coin per epoch",
       true, [](TrainConfig& c, auto& f, auto& v) { c.alternating_flip = parse_bool(v, f); },
       [](const TrainConfig& c) { return fmt_bool(c.alternating_flip); }},
      {"tta",
       "test-time augmentation: none | flip (classify each test image by the mean of its "
       "logits and its mirror image's; the reported test loss and accuracy use it)",
       false, [](TrainConfig& c, auto& f, auto& v) { c.tta = choice(f, v, {"none", "flip"}); },
       [](const TrainConfig& c) { return c.tta; }},
      {"ema",
       "evaluate (and checkpoint) an exponential moving average of the weights and BN statistics, "
       "avg = DECAY * avg + (1 - DECAY) * w after each optimizer step (timm's ModelEmaV2; 0: off)",
       false,
       [](TrainConfig& c, auto& f, auto& v) {
         c.ema = rate_below_one(f, v, "a decay in (0, 1) such as 0.999");
       },
       [](const TrainConfig& c) { return fmt_double(c.ema); }},
      {"ema_every",
       "with --ema: average every K optimizer steps, with DECAY^K, so the horizon in steps stays",
       false, [](TrainConfig& c, auto& f, auto& v) { c.ema_every = positive_int(f, v, 1); },
       [](const TrainConfig& c) { return std::to_string(c.ema_every); }},
      {"ema_warmup",
       "with --ema: the decay at optimizer step t is min(DECAY, (1 + t) / (10 + t)) "
       "(TensorFlow's ExponentialMovingAverage with num_updates), so a short run's average is "
       "not mostly the initial weights",
       true, [](TrainConfig& c, auto& f, auto& v) { c.ema_warmup = parse_bool(v, f); },
       [](const TrainConfig& c) { return fmt_bool(c.ema_warmup); }},
      {"label_smoothing",
       "train against (1 - EPS) * one-hot + EPS / classes (PyTorch's CrossEntropyLoss("
       "label_smoothing=EPS)); the test loss stays plain cross-entropy",
       false,
       [](TrainConfig& c, auto& f, auto& v) {
         c.label_smoothing = rate_below_one(f, v, "EPS in [0, 1), e.g. 0.1");
       },
       [](const TrainConfig& c) { return fmt_double(c.label_smoothing); }},
      {"scale_lr", "multiply the learning rate by the world size", true,
       [](TrainConfig& c, auto& f, auto& v) { c.scale_lr = parse_bool(v, f); },
       [](const TrainConfig& c) { return fmt_bool(c.scale_lr); }},
      {"sync_bn", "synchronise batch norm statistics across workers (SyncBatchNorm)", true,
       [](TrainConfig& c, auto& f, auto& v) { c.sync_bn = parse_bool(v, f); },
       [](const TrainConfig& c) { return fmt_bool(c.sync_bn); }},
      {"seed", "seed for the model, shuffling, augmentation and synthetic data", false,
       [](TrainConfig& c, auto& f, auto& v) {
         c.seed = static_cast<uint64_t>(
             integer_flag(f, v, 0, std::numeric_limits<int64_t>::max(), "an integer >= 0"));
       },
       [](const TrainConfig& c) { return std::to_string(c.seed); }},
      {"output_dir", "checkpoints, metrics.jsonl, curves.svg and TensorBoard's event file go here",
       false,
       [](TrainConfig& c, auto& f, auto& v) {
         if (v.empty()) throw UsageError(fmt::format("{} is empty; expected a directory", f));
         c.output_dir = v;
       },
       [](const TrainConfig& c) { return c.output_dir; }},
      {"resume", "auto (newest valid checkpoint in output_dir, if any) | none | PATH", false,
       [](TrainConfig& c, auto& f, auto& v) {
         if (v.empty()) throw UsageError(fmt::format("{} is empty; expected auto, none or a file", f));
         c.resume = v;
       },
       [](const TrainConfig& c) { return c.resume; }},
      {"overwrite",
       "start a new run even if output_dir holds checkpoints: deletes them, metrics.jsonl, "
       "curves.svg and the TensorBoard event files first",
       true, [](TrainConfig& c, auto& f, auto& v) { c.overwrite = parse_bool(v, f); },
       [](const TrainConfig& c) { return fmt_bool(c.overwrite); }},
      {"eval_every", "evaluate on the test set every N epochs (0: after the last only)", false,
       [](TrainConfig& c, auto& f, auto& v) { c.eval_every = positive_int(f, v, 0); },
       [](const TrainConfig& c) { return std::to_string(c.eval_every); }},
      {"threads", "compute threads per worker (0: OMP_NUM_THREADS, else cores / local workers)",
       false, [](TrainConfig& c, auto& f, auto& v) { c.threads = positive_int(f, v, 0); },
       [](const TrainConfig& c) { return std::to_string(c.threads); }},
      {"device",
       "auto (CUDA when a GPU is visible, else the CPU) | cpu | cuda (GPU LOCAL_RANK among the "
       "visible ones; exits 2 when there is none)",
       false, [](TrainConfig& c, auto& f, auto& v) { c.device = choice(f, v, {"auto", "cpu", "cuda"}); },
       [](const TrainConfig& c) { return c.device; }},
      {"precision",
       "fp32 | bf16 | fp16: bf16/fp16 activations and conv/GEMM inputs with fp32 master weights, "
       "fp16 with a dynamic loss scale (emulated on the CPU: for correctness, not speed)",
       false,
       [](TrainConfig& c, auto& f, auto& v) { c.precision = choice(f, v, {"fp32", "bf16", "fp16"}); },
       [](const TrainConfig& c) { return c.precision; }},
      {"data_on_device",
       "auto | on | off: keep the decoded splits on the compute device as uint8 and augment each "
       "batch there (per step only the sample indices are copied); auto: on for a GPU when the "
       "splits take at most 2 GiB, off on the CPU (its loader thread overlaps with the step)",
       false,
       [](TrainConfig& c, auto& f, auto& v) { c.data_on_device = choice(f, v, {"auto", "on", "off"}); },
       [](const TrainConfig& c) { return c.data_on_device; }},
      {"collective_timeout",
       "seconds a collective (all-reduce, broadcast, ...) may wait for the other ranks before "
       "this worker exits with an error naming it, so dlaunch restarts the group",
       false,
       [](TrainConfig& c, auto& f, auto& v) {
         Bounds b;
         b.min_excluded = true;
         b.max = kMaxCount;  // milliseconds of it must fit in 64 bits
         c.collective_timeout = number_flag(f, v, b, fmt::format("seconds above 0 and at most {}", kMaxCount));
       },
       [](const TrainConfig& c) { return fmt_double(c.collective_timeout); }},
      {"rank_recovery",
       "on | off: when a peer rank dies and dlaunch replaces it in process (--restart_scope rank), "
       "this worker stays up, re-forms the group with the replacement and redoes the interrupted "
       "step; off (and on NCCL groups): it exits, and dlaunch restarts the whole group",
       false,
       [](TrainConfig& c, auto& f, auto& v) { c.rank_recovery = choice(f, v, {"on", "off"}) == "on"; },
       [](const TrainConfig& c) { return std::string(c.rank_recovery ? "on" : "off"); }},
      {"elastic_batch",
       "per_rank | global: when a node is lost and the others go on in process at a smaller "
       "world size, per_rank keeps each rank's --batch_size (the global batch shrinks); global "
       "keeps the global batch (--batch_size times the world at the start), each rank taking "
       "global / world, rounded down when it does not divide",
       false,
       [](TrainConfig& c, auto& f, auto& v) { c.elastic_batch = choice(f, v, {"per_rank", "global"}); },
       [](const TrainConfig& c) { return c.elastic_batch; }},
      {"log_every", "write a metrics line every N steps (0: epochs only)", false,
       [](TrainConfig& c, auto& f, auto& v) { c.log_every = positive_int(f, v, 0); },
       [](const TrainConfig& c) { return std::to_string(c.log_every); }},
      {"tensorboard",
       "also write metrics.jsonl's scalars as a TensorBoard event file in output_dir "
       "(events.out.tfevents.*; --tensorboard=false: none)",
       true, [](TrainConfig& c, auto& f, auto& v) { c.tensorboard = parse_bool(v, f); },
       [](const TrainConfig& c) { return fmt_bool(c.tensorboard); }},
      {"max_steps", "stop after this many optimizer steps in total (0: no limit)", false,
       [](TrainConfig& c, auto& f, auto& v) {
         c.max_steps = integer_flag(f, v, 0, std::numeric_limits<int64_t>::max(),
                                    "a number of steps >= 0 (0: no limit)");
       },
       [](const TrainConfig& c) { return std::to_string(c.max_steps); }},
      {"flash_every",
       "keep the training state in dlaunch's flash directory (DLAUNCH_FLASH_DIR) every N steps, "
       "so a restarted worker loses at most N steps (0: off)",
       false,
       [](TrainConfig& c, auto& f, auto& v) { c.flash_every = positive_int(f, v, 0); },
       [](const TrainConfig& c) { return std::to_string(c.flash_every); }},
      {"no_augment",
       "turn off random crop + flip (never applied to MNIST; with --image_size resampling, "
       "training uses the test transform)",
       true,
       [](TrainConfig& c, auto& f, auto& v) { c.no_augment = parse_bool(v, f); },
       [](const TrainConfig& c) { return fmt_bool(c.no_augment); }},
      {"skip_bad_images",
       "imagefolder: skip images that fail to decode (counted in the log and metrics) instead of "
       "stopping",
       true, [](TrainConfig& c, auto& f, auto& v) { c.skip_bad_images = parse_bool(v, f); },
       [](const TrainConfig& c) { return fmt_bool(c.skip_bad_images); }},
      {"image_size",
       "imagefolder: train and test on S x S images, resized by torchvision's transforms "
       "(RandomResizedCrop + flip for training, Resize + CenterCrop for testing) unless every "
       "image already is S x S (0: the images' own size; they must then share one)",
       false,
       [](TrainConfig& c, auto& f, auto& v) {
         c.image_size = positive_int(f, v, 0);
         if (c.image_size > 0 && c.image_size < 8)  // the network's smallest input
           throw UsageError(fmt::format("{}={} is too small; expected 0 (the images' own size) or "
                                        "at least 8 pixels", f, v));
       },
       [](const TrainConfig& c) { return std::to_string(c.image_size); }},
      {"max_decoded_mib",
       "imagefolder: a split whose decoded images would take more MiB than this (per worker) "
       "keeps them encoded and decodes them each epoch on the loader threads (0: always keep "
       "them decoded)",
       false,
       [](TrainConfig& c, auto& f, auto& v) {
         // Bytes of it (MiB << 20) must fit in 64 bits.
         const int64_t max = std::numeric_limits<int64_t>::max() >> 20;
         c.max_decoded_mib = integer_flag(f, v, 0, max, fmt::format("MiB from 0 to {} (0: no limit)", max));
       },
       [](const TrainConfig& c) { return std::to_string(c.max_decoded_mib); }},
      {"stem",
       "first layer: auto (imagenet for images of 64 pixels or more, else cifar) | imagenet "
       "(7x7 conv stride 2 + 3x3 max-pool stride 2, torchvision's) | cifar (3x3 conv, no "
       "max-pool)",
       false,
       [](TrainConfig& c, auto& f, auto& v) { c.stem = choice(f, v, {"auto", "imagenet", "cifar"}); },
       [](const TrainConfig& c) { return c.stem; }},
  };
  return kFlags;
}

// The flag closest to `name` (already with '_' for '-'), or "" when none is a likely typo.
std::string closest_flag(const std::string& name) {
  std::vector<std::string> names;
  for (const Flag& f : flags()) names.push_back(f.name);
  return closest_word(name, names);
}

const Flag& find_flag(const std::string& name) {
  auto it = std::find_if(flags().begin(), flags().end(), [&](const Flag& f) { return name == f.name; });
  DL_CHECK(it != flags().end()) << "no flag " << name;
  return *it;
}

}  // namespace

TrainConfig parse_train_args(const std::vector<std::string>& args, bool* help) {
  TrainConfig c;
  *help = false;
  // The command line's flags and values, applied after the recipe's (whatever their order).
  std::vector<std::pair<const Flag*, std::string>> given;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      throw UsageError(fmt::format("unexpected argument '{}'; dtrain takes only --flag[=value] "
                                   "options (see dtrain --help)",
                                   arg));
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    std::replace(name.begin(), name.end(), '-', '_');
    auto it = std::find_if(flags().begin(), flags().end(), [&](const Flag& f) { return name == f.name; });
    if (it == flags().end()) {
      const std::string guess = closest_flag(name);
      throw UsageError(fmt::format("unknown flag '{}'{}; see dtrain --help for the list", arg,
                                   guess.empty() ? "" : fmt::format(" (did you mean --{}?)", guess)));
    }
    if (!has_value) {
      if (it->boolean) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        throw UsageError(fmt::format("flag --{} needs a value, e.g. --{}={}", it->name, it->name,
                                     it->show(TrainConfig{})));
      }
    }
    given.emplace_back(&*it, value);
  }
  for (const auto& [flag, value] : given) {
    if (std::string(flag->name) == "recipe") flag->set(c, "--recipe", value);
  }
  for (const auto& [name, value] : recipe_flags(c.recipe)) {
    find_flag(name).set(c, fmt::format("--{} (from --recipe {})", name, c.recipe), value);
    c.recipe_settings.push_back(fmt::format("--{}={}", name, value));
    for (const auto& [flag, own] : given) {
      if (name == flag->name) c.recipe_overrides.push_back(fmt::format("--{}={}", name, own));
    }
  }
  for (const auto& [flag, value] : given) flag->set(c, "--" + std::string(flag->name), value);
  if (c.warmup_percent >= 0) c.warmup_epochs = c.epochs * c.warmup_percent / 100;
  if (c.nesterov && c.optimizer == "sgd" && c.momentum <= 0) {
    throw UsageError("--nesterov needs --momentum > 0 (Nesterov momentum without momentum is undefined)");
  }
  if (c.overwrite && c.resume != "auto" && c.resume != "none") {
    throw UsageError(fmt::format("--overwrite starts a new run but --resume={} asks to continue "
                                 "one; drop one of the two",
                                 c.resume));
  }
  if ((c.cutout > 0 || c.alternating_flip) && c.image_size > 0) {
    throw UsageError(fmt::format("--cutout and --alternating_flip change the crop-and-flip "
                                 "augmentation of images at their own size, but --image_size={} "
                                 "resamples them; drop one of the two",
                                 c.image_size));
  }
  if (c.warmup_epochs >= c.epochs && c.warmup_epochs > 0) {
    throw UsageError(fmt::format("--warmup_epochs={} must be below --epochs={}", c.warmup_epochs, c.epochs));
  }
  return c;
}

void check_data_dir(const TrainConfig& config) {
  if (config.dataset == "synthetic" && !config.data_dir_given) return;
  std::error_code ec;
  const bool is_dir = std::filesystem::is_directory(config.data_dir, ec);
  if (is_dir) return;
  if (config.dataset == "imagefolder" && std::filesystem::is_regular_file(config.data_dir, ec)) {
    return;
  }
  const bool exists = !ec && std::filesystem::exists(config.data_dir, ec);
  const std::string found = exists ? "is not a directory" : "does not exist";
  if (config.dataset == "synthetic") {
    throw UsageError(fmt::format("--data_dir={} {}; --dataset=synthetic reads no files, so drop "
                                 "--data_dir, or name the dataset it holds (--dataset=cifar10 or "
                                 "mnist) and an existing directory",
                                 config.data_dir, found));
  }
  if (config.dataset == "imagefolder") {
    throw UsageError(fmt::format("--data_dir={} {}; expected a directory or a .tar, .tar.gz or "
                                 ".tgz archive holding train/ and test/ with one sub-folder per "
                                 "class (see docs/dtrain.md, Data)",
                                 config.data_dir, exists ? "is neither a directory nor a file" : "does not exist"));
  }
  throw UsageError(fmt::format("--data_dir={} {}; expected the directory holding the {} files "
                               "(see docs/dtrain.md, Data)",
                               config.data_dir, found,
                               config.dataset == "cifar10" ? "CIFAR-10 binary (data_batch_1.bin ...)"
                                                      : "MNIST idx (train-images-idx3-ubyte ...)"));
}

std::string train_usage() {
  std::string out =
      "usage: dtrain [--flag=value ...]\n"
      "Trains a ResNet data-parallel across the workers started by dlaunch (or alone as a world of\n"
      "one). Flags accept dashes too (--batch-size). Defaults in brackets.\n\n";
  TrainConfig defaults;
  for (const Flag& f : flags()) {
    out += fmt::format("  --{:<15} {} [{}]\n", f.name, f.help, f.show(defaults));
  }
  out +=
      "\nOutputs in --output_dir: checkpoint_epoch_NNNN.dtck (each epoch), metrics.jsonl, "
      "curves.svg,\nevents.out.tfevents.* (tensorboard --logdir OUTPUT_DIR).\nSee docs/dtrain.md.\n";
  return out;
}

std::string describe_recipe(const TrainConfig& config) {
  if (config.recipe == "none") return "";
  std::string out = fmt::format("--recipe {}:", config.recipe);
  for (const std::string& s : config.recipe_settings) out += " " + s;
  if (!config.recipe_overrides.empty()) {
    out += "; overridden by the command line:";
    for (const std::string& s : config.recipe_overrides) out += " " + s;
  }
  return out;
}

}  // namespace dlaunch::train
