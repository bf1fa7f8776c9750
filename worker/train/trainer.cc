#include "worker/train/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <optional>
#include <map>
#include <set>

#include "common/error.h"
#include "common/heartbeat.h"
#include "common/log.h"
#include "kernels/backend.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/flash_checkpoint.h"
#include "worker/data/batch_loader.h"
#include "worker/data/dataset.h"
#include "worker/data/distributed_sampler.h"
#include "worker/data/split_cache.h"
#include "worker/data/transforms.h"
#include "worker/ddp/data_parallel.h"
#include "worker/metrics/metrics_log.h"
#include "worker/metrics/tensorboard_log.h"
#include "worker/metrics/progress_bar.h"
#include "worker/metrics/svg_plot.h"
#include "worker/model/resnet.h"
#include "worker/optim/lr_schedule.h"
#include "worker/optim/optimizer.h"
#include "worker/optim/weight_ema.h"
#include "worker/train/data_placement.h"
#include "worker/train/epoch_batches.h"
#include "worker/train/precision.h"
#include "worker/train/step_sums.h"
#include "worker/train/stop_signal.h"
#include "worker/train/worker_runtime.h"

namespace dlaunch::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

constexpr size_t kCheckpointsKept = 3;
// --stem auto picks torchvision's ImageNet stem for images at least this large (see build_model).
constexpr int64_t kImageNetStemFrom = 64;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// What must match between a checkpoint and the run resuming from it. The stem changes the first
// layer's shape; the image size leaves every shape alone (global pooling) but not what the
// weights have learnt, so resuming at another size would train on quietly.
json model_signature(const TrainConfig& c, const data::ImageDataset& ds,
                     const model::ResNetConfig& mc) {
  json sig = {{"model", c.model},
              {"width", c.width},
              {"dataset", c.dataset},
              {"in_channels", ds.channels},
              {"num_classes", ds.num_classes},
              {"optimizer", c.optimizer},
              // SGD keeps momentum buffers only when --momentum is non-zero: resuming across
              // that change would hand the optimizer a state of the wrong size.
              {"momentum_buffers", c.optimizer != "sgd" || c.momentum != 0},
              {"stem", model::stem_name(mc.stem)},
              {"image_size", fmt::format("{}x{}", ds.height, ds.width)}};
  // Image folders: the class names fix what each label means. Another class list (a folder
  // added, renamed or missing) changes that even where the number of classes stays.
  if (!ds.classes.empty()) sig["classes"] = ds.classes;
  return sig;
}

// "" when the checkpoint's class list is `ours` (or it has none: not an image folder run), else
// the first difference.
std::string class_list_difference(const json& have, const std::vector<std::string>& ours) {
  if (!have.contains("classes") && ours.empty()) return "";
  const std::vector<std::string> theirs =
      have.contains("classes") ? have["classes"].get<std::vector<std::string>>() : std::vector<std::string>();
  if (theirs == ours) return "";
  size_t i = 0;
  while (i < theirs.size() && i < ours.size() && theirs[i] == ours[i]) ++i;
  auto at = [&](const std::vector<std::string>& v) {
    return i < v.size() ? fmt::format("'{}'", v[i]) : std::string("nothing");
  };
  return fmt::format("the class list (sorted sub-folders of train/) is {} classes in the checkpoint "
                     "but {} here, first differing at label {}: {} there, {} here",
                     theirs.size(), ours.size(), i, at(theirs), at(ours));
}

json config_json(const TrainConfig& c) {
  return {{"model", c.model},         {"width", c.width},
          {"dataset", c.dataset},     {"epochs", c.epochs},
          {"batch_size", c.batch_size}, {"lr", c.lr},
          {"lr_schedule", c.lr_schedule}, {"warmup_epochs", c.warmup_epochs},
          {"optimizer", c.optimizer}, {"momentum", c.momentum},
          {"nesterov", c.nesterov},   {"weight_decay", c.weight_decay},
          {"scale_lr", c.scale_lr},   {"sync_bn", c.sync_bn},
          {"seed", c.seed},           {"augment", c.augment()},
          {"precision", c.precision},
          // The fast recipe's options (issue 11), recorded so a run can be reproduced; a resume
          // may change them, as it may change --lr.
          {"no_bn_weight_decay", c.no_bn_weight_decay}, {"bn_lr_scale", c.bn_lr_scale},
          {"label_smoothing", c.label_smoothing}, {"cutout", c.cutout},
          {"alternating_flip", c.alternating_flip}, {"tta", c.tta},
          {"ema", c.ema}, {"ema_every", c.ema_every}, {"ema_warmup", c.ema_warmup},
          {"recipe", c.recipe}};
}

// Every setting that keeps a checkpoint from being continued by this run, named as the flag a
// user changes ("" when none): the model signature and the seed (the seed fixes the synthetic
// data, the sampler's order and the augmentation, so a run resumed with another seed is not the
// run that was checkpointed).
std::string incompatible_settings(const json& meta, const TrainConfig& c, const json& want) {
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
      // The CIFAR stem was the only one for most of the time before the stem was recorded.
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
  const json config = meta.value("config", json::object());
  if (config.contains("seed") && config["seed"] != json(c.seed)) {
    add("--seed", text(config["seed"]), json(c.seed));
  }
  const std::string classes = class_list_difference(
      have, want.contains("classes") ? want["classes"].get<std::vector<std::string>>()
                                     : std::vector<std::string>());
  if (!classes.empty()) out += (out.empty() ? "" : "; ") + classes;
  return out;
}

// "20261123T110600Z-9f...: 3 files, newest .../checkpoint_epoch_0007.dtck" per run (files
// without an id, or corrupt, grouped as such), for messages about an --output_dir holding
// checkpoints of other runs.
std::string describe_runs(const std::vector<ckpt::CheckpointFile>& files) {
  std::vector<std::string> order;
  std::map<std::string, std::pair<int, std::string>> runs;  // id -> count, newest
  for (const auto& f : files) {
    const std::string id = f.valid ? (f.run_id().empty() ? "(no run id)" : f.run_id()) : "(corrupt)";
    auto [it, fresh] = runs.try_emplace(id, 0, f.path);
    if (fresh) order.push_back(id);
    ++it->second.first;
  }
  std::string out;
  for (const auto& id : order) {
    const auto& [n, newest] = runs[id];
    out += fmt::format("{}{}: {} file{}, newest {}", out.empty() ? "" : "; ", id, n, n == 1 ? "" : "s",
                       newest);
  }
  return out;
}

// Sends a string from rank 0 to all (length first).
std::string broadcast_string(comm::ProcessGroup& pg, const std::string& s) {
  uint64_t n = s.size();
  pg.broadcast(&n, sizeof n, 0);
  std::string out = pg.rank() == 0 ? s : std::string(n, '\0');
  pg.broadcast(out.data(), n, 0);
  return out;
}

void broadcast_floats(comm::ProcessGroup& pg, std::vector<float>& v) {
  uint64_t n = v.size();
  pg.broadcast(&n, sizeof n, 0);
  v.resize(n);
  pg.broadcast(v.data(), n * sizeof(float), 0);
}

// One epoch while it trains (Trainer::train_epoch): where it stands and its running totals.
struct EpochRun {
  int64_t epoch = 0;        // 0-based
  int64_t steps = 0;        // this rank's steps in the whole epoch
  int64_t seen_before = 0;  // the epoch's samples trained before a re-form (0: none)
  double n_train = 0;       // the training set's size
  int64_t step = 0;         // steps done, counting those skipped on a resume
  double learning_rate = 0;
  // [loss * n, correct, n] for the epoch, on the host: the seed of the StepSums at the start
  // (rank 0 carries a resumed epoch's totals so far, already summed over the ranks that trained
  // them), then what was read from them at a checkpoint or at the end. The steps add to the
  // StepSums, not here.
  double totals[3] = {0, 0, 0};
  double resumed_images = 0;
  double images = 0;  // this rank's images trained in this epoch by this run (not resumed)
  Clock::time_point start = Clock::now();
  Clock::time_point window_start = start;

  // Where step i of this epoch stands in it, for the learning-rate schedule.
  double fraction(int64_t i) const {
    if (seen_before == 0) return static_cast<double>(i) / static_cast<double>(steps);
    return (static_cast<double>(seen_before) +
            static_cast<double>(i) / static_cast<double>(steps) *
                (n_train - static_cast<double>(seen_before))) /
           n_train;
  }
  bool complete() const { return step == steps; }
};

// An epoch's figures over every rank.
struct EpochFigures {
  double loss = 0;
  double accuracy = 0;
  double images_per_s = 0;
};

class Trainer {
 public:
  Trainer(const TrainConfig& config, const WorkerEnv& env, comm::ProcessGroup& pg,
          kernels::Backend& backend, const FaultInjection& fault)
      : c_(config), env_(env), pg_(pg), backend_(backend), fault_(fault), rank0_(pg.rank() == 0) {}

  TrainSummary run();

 private:
  void load_data();
  // --data_on_device: keeps both splits on the backend (uploaded here, once per process) or not.
  void place_data();
  void build_model();
  std::optional<json> resume();  // the checkpoint's meta when resuming
  // Rank 0: refuses a checkpoint this run cannot continue (other settings, missing arrays).
  void check_resumable(const ckpt::LoadedCheckpoint& loaded);
  // Every rank: the model's parameters and buffers and the optimizer's state from rank 0's
  // `ckpt` (empty on the other ranks), then the position and loss scale `meta` records.
  void load_resumed_state(const ckpt::Checkpoint& ckpt, const json& meta);
  // --ema: the average starts from the resumed checkpoint's when it has one, else from the
  // weights (fresh or resumed).
  void start_ema();
  // Rank 0's BN running statistics (the model's and the EMA's) on every rank.
  void broadcast_buffers();
  // Whether a resume carries the checkpoint's EMA: it has one and this run keeps one.
  bool resumes_ema(const json& meta) const { return c_.ema > 0 && meta.contains("ema"); }
  // Takes the position a resumed checkpoint's meta records; returns the epoch to start with.
  int64_t continue_from(const json& meta);
  void continue_inside_epoch(const json& meta, int64_t start_epoch, int64_t epoch_step);
  void open_metrics();  // rank 0
  // Rank 0: one record into metrics.jsonl and, as written there, into the TensorBoard file.
  void record_metrics(const json& record);
  void log_autotuning();
  // After the last epoch: checkpoints on disk, the figures logged, the curves drawn.
  void finish_run();
  // Rank 0: which checkpoint to resume from (nullopt: a fresh start), after clearing leftovers;
  // refuses an --output_dir whose checkpoints this run must not mix with.
  std::optional<ckpt::LoadedCheckpoint> choose_checkpoint();
  std::optional<ckpt::LoadedCheckpoint> choose_disk_checkpoint();
  void overwrite_output_dir();
  void train_epoch(int64_t epoch);
  // The epoch's sample indices for this rank, less those already trained before a resume.
  std::vector<int64_t> epoch_indices(EpochRun& run);
  // One optimizer step on `batch`, its figures added to the step sums.
  void train_step(EpochRun& run, const data::Batch& batch);
  // After a step: the logging window, the progress bar, a flash copy, fault injection.
  void after_step(EpochRun& run);
  void log_window(EpochRun& run);
  void finish_epoch(EpochRun& run);
  // A stop signal ended the epoch: a checkpoint inside it, no evaluation.
  void finish_stopped_epoch(EpochRun& run, const EpochFigures& f);
  void report_epoch(const EpochRun& run, const EpochFigures& f,
                    const std::optional<std::pair<double, double>>& test, double epoch_secs);
  // Every rank: whether any rank received a stop signal (the largest signal number, 0: none).
  // One all-reduce of one number.
  int agree_stop();
  // Every rank, at the same points, with figures all-reduced over the ranks so that all of them
  // stop together: `loss_sum` the summed training loss of the steps since the last check (not
  // checked with fp16, whose loss scaler skips such steps), `bad_weights` the weights that are
  // inf or NaN (nullopt: not counted here). Throws DivergedError naming the steps since the last
  // check that passed; it runs before every checkpoint, so none holds a diverged state.
  void check_finite(std::optional<double> loss_sum, std::optional<double> bad_weights);
  // This rank's count of inf/NaN weights (one read of one number from the backend).
  double count_non_finite_weights();
  std::pair<double, double> evaluate();  // mean loss, accuracy
  // `epoch_step` > 0: a stop inside epoch `epochs_done` + 1 after that many of its steps, with
  // the epoch's all-reduced totals so far. Returns the path written ("" on ranks other than 0).
  std::string save_checkpoint(int64_t epochs_done, int64_t epoch_step = 0,
                              const double* epoch_totals = nullptr);
  ckpt::Checkpoint build_checkpoint(int64_t epochs_done, int64_t epoch_step,
                                    const double* epoch_totals);
  // --flash_every: after step `epoch_step` of epoch `epoch` (0-based), every rank all-reduces the
  // epoch's totals so far; each node's local rank 0 writes the state to the flash directory.
  void save_flash(int64_t epoch, int64_t epoch_step, const double* epoch_totals);
  // Writes `bytes` to the flash copy; a failure (ENOSPC beyond --flash_limit) turns flash
  // copies off with one warning: training goes on with disk checkpoints.
  void write_flash(const std::string& name, const std::vector<uint8_t>& bytes);

  const TrainConfig& c_;
  const WorkerEnv& env_;
  comm::ProcessGroup& pg_;
  kernels::Backend& backend_;  // where the model, its gradients and the optimizer state live
  FaultInjection fault_;
  bool rank0_;

  data::ImageDataset train_set_, test_set_;
  std::unique_ptr<ResidentSplit> resident_train_, resident_test_;  // null: the host loader
  std::unique_ptr<model::ResNet> model_;
  std::unique_ptr<ddp::DataParallel> dp_;
  std::unique_ptr<StepSums> step_sums_;  // the steps' loss and accuracy, where the steps run
  double live_loss_ = 0;  // rank 0's progress line: the loss of the latest window read
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::WeightEma> ema_;  // --ema; null when off
  std::vector<float> resumed_ema_;         // the checkpoint's EMA until start_ema() takes it
  std::unique_ptr<MixedPrecision> precision_;  // --precision: rounding, fp16's loss scale
  optim::LrSchedule schedule_;
  std::unique_ptr<metrics::MetricsLog> metrics_;
  std::unique_ptr<metrics::TensorBoardLog> tensorboard_;  // null with --tensorboard=false
  metrics::ProgressBar progress_{false};
  Tensor images_;  // the batch: on the host, or on backend_ with data on the device
  int64_t global_step_ = 0;
  // The global steps after which check_finite last found the loss and the weights finite.
  int64_t loss_finite_at_ = 0, weights_finite_at_ = 0;
  bool stop_ = false;
  int stop_signal_ = 0;
  std::string run_id_;  // rank 0: the identity written into every checkpoint of this run
  // Resuming inside an epoch: the steps of it already done and its totals so far.
  int64_t resume_epoch_step_ = 0;
  // Resuming inside an epoch trained by another world or batch size: how many entries of the
  // epoch's permutation were trained (a prefix, distributed_sampler.h). And, for the epoch in
  // progress, that prefix when it began here (0: it began at its start), for its checkpoints.
  int64_t resume_seen_ = 0;
  int64_t epoch_seen_before_ = 0;
  double resume_totals_[3] = {0, 0, 0};
  // The cost of agreeing on stop signals: all-reduces and the seconds they took.
  int64_t stop_checks_ = 0;
  double stop_check_secs_ = 0;
  TrainSummary summary_;
  std::unique_ptr<ckpt::FlashWriter> flash_;  // null: no flash copies on this rank
  int64_t flash_writes_ = 0;  // mid-epoch flash copies and the seconds they took (all ranks)
  double flash_secs_ = 0;
  ckpt::BackgroundPersister persister_;     // rank 0's disk checkpoints, off this thread
};

void Trainer::load_data() {
  data::ImageFolderOptions folder;
  folder.skip_bad_images = c_.skip_bad_images;
  folder.threads = kernels::host_threads();
  folder.image_size = c_.image_size;
  folder.max_decoded_bytes = c_.max_decoded_mib << 20;
  if (c_.image_size > 0 && c_.dataset != "imagefolder") {
    throw UsageError(fmt::format("--image_size={} applies to --dataset=imagefolder only, not "
                                 "--dataset={} (whose images have a fixed size); drop it",
                                 c_.image_size, c_.dataset));
  }
  const auto start = Clock::now();
  // A worker restarted by dlaunch finds the data its predecessor loaded in the flash directory.
  const std::string cache_dir = c_.flash_every > 0 ? env_.flash_dir : std::string();
  const std::string cache_key = data::split_cache_key(c_.dataset, c_.data_dir, c_.seed, folder);
  std::optional<data::DatasetSplits> cached;
  if (!cache_dir.empty()) cached = data::read_split_cache(cache_dir, cache_key);
  data::DatasetSplits splits =
      cached ? std::move(*cached) : data::load_splits(c_.dataset, c_.data_dir, c_.seed, folder);
  // Sets decoded per epoch are too large to copy into the flash directory.
  if (!cache_dir.empty() && !cached && env_.local_rank == 0 &&
      !splits.train.decodes_per_epoch() && !splits.test.decodes_per_epoch()) {
    data::write_split_cache(cache_dir, cache_key, splits);
  }
  if (cached && rank0_) log_info("data: taken from the flash directory (loaded by an earlier attempt)");
  if (rank0_ && c_.dataset == "imagefolder") {
    log_info("data: imagefolder {}: decoded {} + {} images in {:.2f} s on {} threads, kept "
             "decoded in memory (uint8): {:.1f} MiB",
             c_.data_dir, splits.train.size(), splits.test.size(), seconds_since(start),
             folder.threads,
             static_cast<double>(splits.train.pixels.size() + splits.test.pixels.size()) / (1 << 20));
    for (const data::ImageDataset* ds : {&splits.train, &splits.test}) {
      if (ds->decodes_per_epoch()) {
        // The bound: the encoded bytes, plus the batches in flight (the one being assembled and
        // BatchLoader's two ahead) as floats, plus a decoded image per decode thread.
        const double batches = 3.0 * c_.batch_size * ds->image_elems() * sizeof(float);
        log_info("data: {}: decoded it would take more than --max_decoded_mib={}: kept encoded "
                 "({:.1f} MiB) and decoded each epoch by {} loader threads; memory bound {:.1f} "
                 "MiB plus one decoded image per thread",
                 ds->name, c_.max_decoded_mib, static_cast<double>(ds->encoded.size()) / (1 << 20),
                 ds->decode_threads,
                 (static_cast<double>(ds->encoded.size()) + batches) / (1 << 20));
      }
      if (ds->resampled()) {
        log_info("data: {}: images of their own sizes, {} to {}x{} (--image_size)", ds->name,
                 ds == &splits.train && c_.augment()
                     ? "RandomResizedCrop(scale 0.08-1, ratio 3/4-4/3) + flip"
                     : fmt::format("Resize({}) + CenterCrop", data::eval_resize_size(ds->height)),
                 ds->width, ds->height);
      }
    }
    for (const std::string& line : data::describe_image_folder(splits)) log_info("data: {}", line);
  }
  train_set_ = std::move(splits.train);
  test_set_ = std::move(splits.test);
  data::truncate(train_set_, c_.limit_train_samples);
  data::truncate(test_set_, c_.limit_test_samples);
  if (rank0_) {
    log_info("data: {} ({} images) / {} ({} images), {}x{}x{}, augmentation {}", train_set_.name,
             train_set_.size(), test_set_.name, test_set_.size(), train_set_.channels,
             train_set_.height, train_set_.width, c_.augment() ? "on" : "off");
  }
}

void Trainer::place_data() {
  const DataPlacement placement = choose_data_placement(
      c_.data_on_device, backend_.host_accessible(), train_set_, test_set_);
  if (!placement.on_device) {
    if (rank0_) log_info("data: batches assembled on the host ({})", placement.reason);
    return;
  }
  const auto start = Clock::now();
  resident_train_ = std::make_unique<ResidentSplit>(backend_, train_set_);
  resident_test_ = std::make_unique<ResidentSplit>(backend_, test_set_);
  images_ = Tensor(backend_);
  if (rank0_) {
    log_info("data: kept on {} as uint8, uploaded in {:.2f} s ({}); each step copies only "
             "the sample indices and augments there",
             backend_.name(), seconds_since(start), placement.reason);
  }
}

void Trainer::build_model() {
  model::ResNetConfig mc;
  mc.depth = c_.depth();
  mc.width = c_.width;
  mc.in_channels = static_cast<int>(train_set_.channels);
  mc.num_classes = static_cast<int>(train_set_.num_classes);
  mc.image_size = static_cast<int>(train_set_.height);
  DL_CHECK(kernels::parse_dtype(c_.precision, &mc.precision)) << c_.precision;  // train_config checked
  precision_ = std::make_unique<MixedPrecision>(mc.precision, backend_);
  // auto: torchvision's stem once the images are large enough that dividing them by 4 before
  // layer1 leaves 16 pixels or more; below that the CIFAR stem keeps the resolution.
  const bool imagenet_stem =
      c_.stem == "imagenet" ||
      (c_.stem == "auto" && std::min(train_set_.height, train_set_.width) >= kImageNetStemFrom);
  mc.stem = imagenet_stem ? model::ResNetStem::kImageNet : model::ResNetStem::kCifar;
  model_ = std::make_unique<model::ResNet>(mc, c_.seed, backend_);
  dp_ = std::make_unique<ddp::DataParallel>(*model_, pg_, c_.sync_bn);
  step_sums_ = std::make_unique<StepSums>(backend_);
  dp_->set_label_smoothing(static_cast<float>(c_.label_smoothing));
  dp_->set_tta_flip(c_.tta == "flip");

  optim::OptimConfig oc;
  oc.kind = optim::parse_optim_kind(c_.optimizer);
  oc.momentum = c_.momentum;
  oc.nesterov = c_.nesterov;
  oc.weight_decay = c_.weight_decay;
  oc.decay_bn_and_bias = !c_.no_bn_weight_decay;
  oc.bn_lr_scale = c_.bn_lr_scale;
  optimizer_ = std::make_unique<optim::Optimizer>(oc, backend_);

  schedule_.kind = optim::parse_lr_schedule(c_.lr_schedule);
  schedule_.base_lr = c_.lr * (c_.scale_lr ? pg_.size() : 1);
  schedule_.warmup_epochs = c_.warmup_epochs;
  schedule_.total_epochs = c_.epochs;
  if (rank0_) {
    log_info("model: resnet{} width {}, {} stem ({}; {}), {} parameters, {} gradient buckets; world "
             "size {} ({}), SyncBN {}, {} threads per worker, on {}",
             c_.depth(), c_.width, model::stem_name(mc.stem),
             imagenet_stem ? "7x7 conv stride 2 + 3x3 max-pool stride 2"
                           : "3x3 conv stride 1, no max-pool",
             c_.stem == "auto" ? "--stem auto by image size" : "--stem", model_->num_params(),
             dp_->reducer().buckets().size(),
             pg_.size(), pg_.backend(), c_.sync_bn ? "on" : "off", kernels::host_threads(),
             backend_.name());
    log_info("{}", precision_->describe());
  }
}

void Trainer::overwrite_output_dir() {
  int removed = 0;
  for (const std::string& path : ckpt::list_checkpoints(c_.output_dir)) {
    std::error_code ec;
    fs::remove(path, ec);
    if (ec) {
      throw SystemError(fmt::format("--overwrite: cannot delete {}: {}", path, ec.message()));
    }
    ++removed;
  }
  for (const char* name : {"metrics.jsonl", "curves.svg"}) {
    std::error_code ec;
    if (fs::remove(fs::path(c_.output_dir) / name, ec)) ++removed;
  }
  removed += metrics::remove_event_files(c_.output_dir);
  if (removed > 0) {
    log_warning("--overwrite: deleted {} file(s) of earlier runs from {} (checkpoints, "
                "metrics.jsonl, curves.svg, TensorBoard event files)",
                removed, c_.output_dir);
  }
}

std::optional<ckpt::LoadedCheckpoint> Trainer::choose_checkpoint() {
  std::optional<ckpt::LoadedCheckpoint> disk = choose_disk_checkpoint();
  // A restarted worker of this job finds the flash copy its predecessor left (--flash_every).
  if (c_.resume != "auto" || c_.overwrite || !flash_) return disk;
  return ckpt::newest_with_flash(std::move(disk), flash_->dir());
}

std::optional<ckpt::LoadedCheckpoint> Trainer::choose_disk_checkpoint() {
  for (const std::string& path : ckpt::remove_stale_temporaries(c_.output_dir)) {
    log_info("removed {}, left by a checkpoint write that was interrupted", path);
  }
  if (c_.overwrite) {
    overwrite_output_dir();
    return std::nullopt;
  }
  const std::vector<ckpt::CheckpointFile> files = ckpt::scan_checkpoints(c_.output_dir);
  if (c_.resume == "none") {
    if (files.empty()) return std::nullopt;
    // Pruning and --resume auto go by the numbers in the names: a new run among an earlier
    // run's checkpoints would have its own deleted, or be mistaken for the other.
    throw UsageError(fmt::format(
        "--resume none starts a new run, but --output_dir {} holds {} checkpoint(s) of an "
        "earlier run ({}); continue that run with --resume auto, delete them and start over "
        "with --overwrite, or pass another --output_dir",
        c_.output_dir, files.size(), describe_runs(files)));
  }
  std::vector<const ckpt::CheckpointFile*> valid;
  for (const auto& f : files) {
    if (f.valid) {
      valid.push_back(&f);
    } else {
      log_warning("skipping checkpoint {}: {}", f.path, f.error);
    }
  }
  if (c_.resume != "auto") {
    ckpt::LoadedCheckpoint loaded{c_.resume, ckpt::read_checkpoint(c_.resume)};
    const json id = loaded.ckpt.meta.value("run_id", json(""));
    for (const auto* f : valid) {
      if (json(f->run_id()) != id) {
        throw UsageError(fmt::format(
            "--resume {} continues run {}, but --output_dir {} holds checkpoints of another run "
            "({}): the two would prune each other's files; pass another --output_dir",
            c_.resume, id.get<std::string>().empty() ? "(no run id)" : id.get<std::string>(),
            c_.output_dir, describe_runs(files)));
      }
    }
    return loaded;
  }
  if (files.empty()) return std::nullopt;
  if (valid.empty()) {
    std::string why;
    for (const auto& f : files) why += fmt::format("\n  {}: {}", f.path, f.error);
    throw ckpt::CheckpointError(fmt::format(
        "--output_dir {} holds {} checkpoint(s) but none is valid, so there is nothing to "
        "resume; dtrain will not start over on top of them. Move them away, pass --overwrite to "
        "delete them and start a new run, or --resume PATH to load a good copy:{}",
        c_.output_dir, files.size(), why));
  }
  // Files without a run id were written before run ids existed; the run that resumed from one
  // carries on under a new id, so they count as nobody's (never pruned, never a second run).
  std::set<std::string> runs;
  for (const auto* f : valid) {
    if (!f->run_id().empty()) runs.insert(f->run_id());
  }
  if (runs.size() > 1) {
    throw UsageError(fmt::format(
        "--output_dir {} holds checkpoints of {} runs ({}); dtrain cannot tell which one to "
        "continue: pass --resume PATH, --overwrite to start a new run, or another --output_dir",
        c_.output_dir, runs.size(), describe_runs(files)));
  }
  return ckpt::LoadedCheckpoint{valid.front()->path, ckpt::read_checkpoint(valid.front()->path)};
}

void Trainer::check_resumable(const ckpt::LoadedCheckpoint& loaded) {
  std::string differ =
      incompatible_settings(loaded.ckpt.meta, c_,
                            model_signature(c_, train_set_, model_->config()));
  if (!differ.empty()) {
    throw UsageError(fmt::format(
        "checkpoint {} cannot be continued by this run: {}. Resume with the checkpoint's "
        "settings, or start a new run with --overwrite or another --output_dir",
        loaded.path, differ));
  }
  if (loaded.ckpt.find("optimizer.state") == nullptr) {
    throw ckpt::CheckpointError(
        fmt::format("checkpoint {} has no 'optimizer.state' array", loaded.path));
  }
  // Every parameter and every buffer (BN running statistics): resuming with fresh
  // statistics would evaluate with the wrong normalisation without a word.
  std::vector<std::pair<std::string, size_t>> expected{{"params", model_->num_params()}};
  const auto names = model_->buffer_names();
  const auto buffers = model_->buffers();
  for (size_t i = 0; i < buffers.size(); ++i) {
    expected.emplace_back("buffer." + names[i], static_cast<size_t>(buffers[i]->numel()));
  }
  if (resumes_ema(loaded.ckpt.meta)) {
    size_t n = model_->num_params();
    for (const Tensor* b : buffers) n += static_cast<size_t>(b->numel());
    expected.emplace_back("ema", n);
  }
  ckpt::require_arrays(loaded.ckpt, loaded.path, expected);
}

void Trainer::load_resumed_state(const ckpt::Checkpoint& ckpt, const json& meta) {
  // Parameters, buffers and optimizer state from rank 0's checkpoint, in that order in one
  // broadcast: one per BN buffer cost a round trip each (0.5 s in all for ResNet-18 on a loaded
  // host, on the path of every restarted worker).
  auto names = model_->buffer_names();
  auto buffers = model_->buffers();
  std::vector<float> all;
  if (rank0_) {  // present and sized: require_arrays
    all = *ckpt.find("params");
    for (size_t i = 0; i < buffers.size(); ++i) {
      const std::vector<float>& v = *ckpt.find("buffer." + names[i]);
      all.insert(all.end(), v.begin(), v.end());
    }
    if (resumes_ema(meta)) all.insert(all.end(), ckpt.find("ema")->begin(), ckpt.find("ema")->end());
    const std::vector<float>& opt = *ckpt.find("optimizer.state");
    all.insert(all.end(), opt.begin(), opt.end());
  }
  broadcast_floats(pg_, all);
  size_t at = 0;
  auto take = [&](size_t n) {
    DL_CHECK(at + n <= all.size()) << at << " + " << n << " > " << all.size();
    const float* p = all.data() + at;
    at += n;
    return p;
  };
  model_->params_tensor().copy_from_host(take(model_->num_params()));
  size_t buffer_floats = 0;
  for (auto* b : buffers) {
    b->copy_from_host(take(static_cast<size_t>(b->numel())));
    buffer_floats += static_cast<size_t>(b->numel());
  }
  if (resumes_ema(meta)) {
    const size_t n = model_->num_params() + buffer_floats;
    const float* p = take(n);
    resumed_ema_.assign(p, p + n);
  }
  std::vector<float> state(all.begin() + static_cast<std::ptrdiff_t>(at), all.end());
  optimizer_->load_state(std::move(state), meta.value("optimizer_steps", int64_t{0}));
  // fp16's loss scale goes on where it was (checkpoints from before it existed start afresh).
  precision_->load_state_json(meta.value("grad_scaler", json()));
}

// Rank 0 decides and reads; the others learn the outcome by broadcast, so a bad checkpoint
// fails every rank with the same message instead of hanging the others in a collective.
std::optional<json> Trainer::resume() {
  // The phases of a restarted worker's resume are timed at debug level: they are on the path
  // from a worker's death to the next step (docs/benchmarks.md, "Flash checkpoints").
  const Clock::time_point t0 = Clock::now();
  json decision = json::object();
  ckpt::Checkpoint ckpt;
  if (rank0_) {
    try {
      std::optional<ckpt::LoadedCheckpoint> loaded = choose_checkpoint();
      if (loaded) {
        check_resumable(*loaded);
        decision = {{"resume", loaded->path}, {"meta", loaded->ckpt.meta}};
        run_id_ = loaded->ckpt.meta.value("run_id", std::string());
        ckpt = std::move(loaded->ckpt);
      }
      if (run_id_.empty()) {
        run_id_ = ckpt::new_run_id();
        log_info("run id {} (recorded in every checkpoint of this run)", run_id_);
      }
    } catch (const UsageError& e) {
      decision = {{"error", e.what()}, {"kind", "usage"}};
    } catch (const Error& e) {
      decision = {{"error", e.what()}, {"kind", "checkpoint"}};
    }
  }
  if (rank0_) log_debug("resume: chose and read the state in {:.0f} ms", 1e3 * seconds_since(t0));
  decision = json::parse(broadcast_string(pg_, decision.dump()));
  const Clock::time_point t_decided = Clock::now();
  if (decision.contains("error")) {
    std::string msg = decision["error"];
    if (decision["kind"] == "usage") throw UsageError(msg);
    throw ckpt::CheckpointError(msg);
  }
  if (!decision.contains("resume")) {
    dp_->broadcast_state();
    return std::nullopt;
  }
  load_resumed_state(ckpt, decision["meta"]);
  log_debug("resume: decision agreed {:.0f} ms after this rank began; state broadcast in {:.0f} ms",
            1e3 * std::chrono::duration<double>(t_decided - t0).count(),
            1e3 * seconds_since(t_decided));
  summary_.resumed = true;
  summary_.resumed_from = decision["resume"];
  return decision["meta"];
}

double Trainer::count_non_finite_weights() {
  // x * 1 leaves every value as it was: the op only counts here.
  return static_cast<double>(backend_.unscale_count_non_finite(
      static_cast<int64_t>(model_->num_params()), 1.0f, model_->params()));
}

void Trainer::check_finite(std::optional<double> loss_sum, std::optional<double> bad_weights) {
  const bool loss_bad = loss_sum && !precision_->loss_scaling() && !std::isfinite(*loss_sum);
  const bool weights_bad = bad_weights && *bad_weights > 0;
  if (!loss_bad && !weights_bad) {
    if (loss_sum) loss_finite_at_ = global_step_;
    if (bad_weights) weights_finite_at_ = global_step_;
    return;
  }
  throw DivergedError(fmt::format(
      "training diverged: the {} became {} between step {} and step {} (--lr {}, --precision "
      "{}); stopped without writing a checkpoint of it (those in {} are from before): resume "
      "from them with a lower --lr, more --warmup_epochs or another --precision",
      loss_bad ? "training loss" : "weights",
      loss_bad ? fmt::format("{}", *loss_sum) : std::string("inf or NaN"),
      loss_bad ? loss_finite_at_ : weights_finite_at_, global_step_, c_.lr, c_.precision, c_.output_dir));
}

int Trainer::agree_stop() {
  double sig = stop_requested();
  const auto t0 = Clock::now();
  pg_.allreduce(&sig, 1, comm::ReduceOp::kMax);
  stop_check_secs_ += seconds_since(t0);
  ++stop_checks_;
  if (sig != 0) stop_watch_settle();  // the boundary: the checkpoint is written whatever it takes
  return static_cast<int>(sig);
}

void Trainer::train_epoch(int64_t epoch) {
  EpochRun run;
  run.epoch = epoch;
  std::vector<int64_t> indices = epoch_indices(run);
  EpochBatches batches(train_set_, resident_train_.get(), std::move(indices), c_.batch_size,
                       c_.augment(), c_.seed, epoch, {c_.cutout, c_.alternating_flip});
  run.start = run.window_start = Clock::now();
  if (rank0_) std::copy(resume_totals_, resume_totals_ + 3, run.totals);
  run.resumed_images = run.totals[2];
  step_sums_->begin_epoch(run.totals);
  resume_epoch_step_ = 0;
  std::fill(resume_totals_, resume_totals_ + 3, 0.0);
  run.learning_rate = optim::lr_at(schedule_, static_cast<double>(epoch) + run.fraction(run.step));
  while (auto batch = batches.next(images_)) {
    train_step(run, *batch);
    after_step(run);
    if (stop_signal_ != 0 || (c_.max_steps > 0 && global_step_ >= c_.max_steps)) {
      stop_ = true;
      break;
    }
  }
  finish_epoch(run);
}

std::vector<int64_t> Trainer::epoch_indices(EpochRun& run) {
  data::DistributedSampler sampler(train_set_.size(), pg_.size(), pg_.rank(), /*shuffle=*/true,
                                   c_.seed, /*drop_last=*/false);
  // After a re-form at another world size, the rest of the epoch's samples, shared anew.
  run.seen_before = epoch_seen_before_ = std::exchange(resume_seen_, 0);
  std::vector<int64_t> indices = run.seen_before > 0
                                     ? sampler.indices_after(run.epoch, run.seen_before)
                                     : sampler.indices(run.epoch);
  run.steps = (static_cast<int64_t>(indices.size()) + c_.batch_size - 1) / c_.batch_size;
  run.n_train = static_cast<double>(train_set_.size());
  // Resuming inside this epoch: the sampler's order is a pure function of (seed, epoch), so
  // skipping the batches already trained continues exactly where the stop happened.
  run.step = std::min(resume_epoch_step_, run.steps);
  indices.erase(indices.begin(),
                indices.begin() + std::min<int64_t>(run.step * c_.batch_size,
                                                    static_cast<int64_t>(indices.size())));
  return indices;
}

void Trainer::train_step(EpochRun& run, const data::Batch& batch) {
  run.learning_rate =
      optim::lr_at(schedule_, static_cast<double>(run.epoch) + run.fraction(run.step));
  dp_->train_step_into(images_, batch.labels.data(), precision_->loss_scale(), step_sums_->sums(),
                       StepSums::kTriples);
  if (precision_->finish_step(model_->grads(), model_->num_params())) {
    optimizer_->step(model_->params(), model_->grads(), model_->num_params(),
                     static_cast<float>(run.learning_rate), model_->param_info());
    if (ema_) ema_->after_step(optimizer_->step_count());
  }
  ++global_step_;
  ++run.step;
  heartbeat();
  stop_watch_progress(/*step=*/true);
  // Every rank learns of a signal any rank got, after the same step: the checkpoint below is
  // then the state of every rank.
  if (global_step_ % c_.stop_check_every == 0) stop_signal_ = agree_stop();
  run.images += static_cast<double>(batch.size);
}

void Trainer::after_step(EpochRun& run) {
  bool last = run.complete() || (c_.max_steps > 0 && global_step_ >= c_.max_steps) ||
              stop_signal_ != 0;
  if (c_.log_every > 0 && (global_step_ % c_.log_every == 0 || last)) log_window(run);
  if (rank0_) {
    // The window's loss so far where reading it is free (the CPU), else the last window's: a
    // per-step read would make every step wait for the device.
    if (auto loss = step_sums_->free_window_loss()) live_loss_ = *loss;
    progress_.update(run.epoch + 1, run.step, run.steps, live_loss_,
                     run.images * pg_.size() / std::max(seconds_since(run.start), 1e-9));
  }
  if (c_.flash_every > 0 && global_step_ % c_.flash_every == 0 && run.step < run.steps) {
    step_sums_->read_totals(run.totals);
    save_flash(run.epoch, run.step, run.totals);
  }
  // After the step's logging, so the metrics show the step the worker died after.
  if (global_step_ == fault_.fail_at_step && pg_.rank() == fault_.fail_rank) {
    log_warning("fault injection: {} rank {} after step {} (DTRAIN_FAIL_AT_STEP)",
                fault_.signal == SIGSTOP ? "stopping" : "killing", pg_.rank(), global_step_);
    std::raise(fault_.signal);
  }
}

void Trainer::log_window(EpochRun& run) {
  double w[3];
  step_sums_->take_window(w);
  pg_.allreduce(w, 3, comm::ReduceOp::kSum);
  live_loss_ = w[0] / w[2];
  double secs = seconds_since(run.window_start);
  double ips = secs > 0 ? w[2] / secs : 0;
  if (rank0_) {
    json rec = {{"kind", "step"},
                {"epoch", run.epoch + 1},
                {"epoch_progress", static_cast<double>(run.epoch) + run.fraction(run.step)},
                {"step", global_step_},
                {"loss", w[0] / w[2]},
                {"train_accuracy", w[1] / w[2]},
                {"lr", run.learning_rate},
                {"images_per_s", ips},
                {"world_size", pg_.size()}};
    if (precision_->loss_scaling()) {  // fp16: the scale after this step, the skips so far
      rec["loss_scale"] = precision_->loss_scale();
      rec["skipped_steps"] = precision_->skipped_steps();
    }
    record_metrics(rec);
  }
  run.window_start = Clock::now();
  // After the window's record: the metrics show the step the loss went bad at.
  check_finite(w[0], std::nullopt);
}

void Trainer::finish_epoch(EpochRun& run) {
  step_sums_->read_totals(run.totals);  // waits for the epoch's last step
  double train_secs = seconds_since(run.start);
  // Rank 0's resumed totals are counted once: the others add zeros for them. The inf/NaN
  // weights ride along, checked before the evaluation and the checkpoint.
  double all[4] = {run.totals[0], run.totals[1], run.totals[2], count_non_finite_weights()};
  pg_.allreduce(all, 4, comm::ReduceOp::kSum);
  std::copy(all, all + 3, run.totals);
  check_finite(all[0], all[3]);
  EpochFigures f;
  f.loss = run.totals[0] / run.totals[2];
  f.accuracy = run.totals[1] / run.totals[2];
  f.images_per_s = (run.totals[2] - run.resumed_images) / train_secs;
  if (stop_signal_ != 0) return finish_stopped_epoch(run, f);

  bool last_epoch = run.epoch + 1 == c_.epochs || stop_;
  bool do_eval = last_epoch || (c_.eval_every > 0 && (run.epoch + 1) % c_.eval_every == 0);
  broadcast_buffers();  // rank 0's running statistics for eval and the checkpoint
  std::optional<std::pair<double, double>> test;
  if (do_eval) test = evaluate();
  double epoch_secs = seconds_since(run.start);
  progress_.clear();
  if (rank0_) report_epoch(run, f, test, epoch_secs);
  if (test) {
    summary_.test_loss = test->first;
    summary_.test_accuracy = test->second;
  }
  // A checkpoint marks a completed epoch; a --max_steps stop in mid-epoch writes none.
  if (run.complete()) {
    summary_.epochs_done = run.epoch + 1;
    summary_.partial_epoch = summary_.partial_epoch_steps = summary_.partial_epoch_of = 0;
    save_checkpoint(run.epoch + 1);
  } else {
    summary_.partial_epoch = run.epoch + 1;
    summary_.partial_epoch_steps = run.step;
    summary_.partial_epoch_of = run.steps;
  }
}

// Preemption: no evaluation (the grace period is short); the checkpoint records the step inside
// the epoch so the requeued run continues from there.
void Trainer::finish_stopped_epoch(EpochRun& run, const EpochFigures& f) {
  progress_.clear();
  broadcast_buffers();  // rank 0's running statistics for the checkpoint
  summary_.partial_epoch = run.epoch + 1;
  summary_.partial_epoch_steps = run.step;
  summary_.partial_epoch_of = run.steps;
  if (rank0_) {
    fmt::print("epoch {:>3}/{}  stopped by {} after step {} of {}  train loss {:.4f} acc {:6.2f}% "
               "so far\n",
               run.epoch + 1, c_.epochs, stop_signal_name(stop_signal_), run.step, run.steps,
               f.loss, 100 * f.accuracy);
    std::fflush(stdout);
  }
  summary_.stop_signal = stop_signal_;
  summary_.stop_checkpoint = save_checkpoint(run.epoch, run.step, run.totals);
}

// Rank 0: the epoch's line on stdout and its record in the metrics.
void Trainer::report_epoch(const EpochRun& run, const EpochFigures& f,
                           const std::optional<std::pair<double, double>>& test,
                           double epoch_secs) {
  std::string test_part = test ? fmt::format("test loss {:.4f} acc {:6.2f}%", test->first, 100 * test->second)
                               : std::string("test -");
  // A --max_steps stop inside the epoch says so: its figures cover only the steps done.
  std::string partial =
      run.complete() ? std::string()
                     : fmt::format(" (partial: {} of {} steps, --max_steps)", run.step, run.steps);
  fmt::print("epoch {:>3}/{}{}  train loss {:.4f} acc {:6.2f}%  {}  {:.0f} img/s  lr {:.5f}  {:.1f} s\n",
             run.epoch + 1, c_.epochs, partial, f.loss, 100 * f.accuracy, test_part,
             f.images_per_s, run.learning_rate, epoch_secs);
  std::fflush(stdout);
  json rec = {{"kind", "epoch"},
              {"epoch", run.epoch + 1},
              {"step", global_step_},
              {"loss", f.loss},
              {"train_accuracy", f.accuracy},
              {"lr", run.learning_rate},
              {"images_per_s", f.images_per_s},
              {"world_size", pg_.size()},
              {"epoch_time_s", epoch_secs},
              {"complete", run.complete()},
              {"epoch_steps", run.step},
              {"epoch_steps_total", run.steps}};
  if (test) {
    rec["test_loss"] = test->first;
    rec["test_accuracy"] = test->second;
  }
  record_metrics(rec);
}

void Trainer::broadcast_buffers() {
  dp_->broadcast_buffers();
  if (ema_) {
    for (Tensor* t : ema_->buffers()) ddp::broadcast_tensor(pg_, *t);
  }
}

void Trainer::start_ema() {
  if (c_.ema <= 0) return;
  ema_ = std::make_unique<optim::WeightEma>(*model_, c_.ema, c_.ema_every, c_.ema_warmup);
  const bool resumed = !resumed_ema_.empty();
  if (resumed) ema_->load_state(std::exchange(resumed_ema_, {}));
  if (rank0_) {
    log_info("EMA of the weights and BN statistics: decay {} per step{}, averaged every {} step(s); "
             "evaluation uses it; starts from {}",
             c_.ema, c_.ema_warmup ? " (warm-up: min(decay, (1 + t) / (10 + t)))" : "", c_.ema_every,
             resumed ? "the checkpoint's" : summary_.resumed ? "the resumed weights (the checkpoint has none)"
                                                            : "the initial weights");
  }
}

std::pair<double, double> Trainer::evaluate() {
  // --ema: the averaged weights are evaluated, the model's own come back afterwards.
  std::optional<optim::WeightEma::Applied> averaged;
  if (ema_) averaged.emplace(*ema_);
  // Exact shards, no padding: rank r takes samples r, r + world, ... so every test image counts
  // once.
  std::vector<int64_t> mine;
  for (int64_t k = pg_.rank(); k < test_set_.size(); k += pg_.size()) mine.push_back(k);
  EpochBatches batches(test_set_, resident_test_.get(), std::move(mine), std::max(c_.batch_size, 256),
                       false, c_.seed, 0);
  double tot[3] = {0, 0, 0};
  while (auto batch = batches.next(images_)) {
    ddp::StepResult r = dp_->eval_step(images_, batch->labels.data());
    tot[0] += r.loss;
    tot[1] += r.correct;
    tot[2] += static_cast<double>(batch->size);
    heartbeat();
    stop_watch_progress(/*step=*/false);
  }
  pg_.allreduce(tot, 3, comm::ReduceOp::kSum);
  return {tot[0] / tot[2], tot[1] / tot[2]};
}

std::string Trainer::save_checkpoint(int64_t epochs_done, int64_t epoch_step,
                                     const double* epoch_totals) {
  if (!rank0_) return "";
  const std::string name = epoch_step > 0
                               ? ckpt::partial_checkpoint_file_name(epochs_done, global_step_)
                               : ckpt::checkpoint_file_name(epochs_done);
  std::string path = (fs::path(c_.output_dir) / name).string();
  // Encoded once: the flash copy now, the disk file from the same bytes on the persister's
  // thread (fsync and pruning off the training thread).
  auto bytes = std::make_shared<const std::vector<uint8_t>>(
      ckpt::encode_checkpoint(build_checkpoint(epochs_done, epoch_step, epoch_totals)));
  if (flash_) write_flash(name, *bytes);
  persister_.submit(bytes, path, [dir = c_.output_dir, run = run_id_] {
    ckpt::prune_checkpoints(dir, kCheckpointsKept, run);
  });
  return path;
}

void Trainer::save_flash(int64_t epoch, int64_t epoch_step, const double* epoch_totals) {
  // Summed over the ranks (rank 0 carries a resumed epoch's totals), as a stop's checkpoint.
  double tot[4] = {epoch_totals[0], epoch_totals[1], epoch_totals[2], count_non_finite_weights()};
  pg_.allreduce(tot, 4, comm::ReduceOp::kSum);
  check_finite(tot[0], tot[3]);
  if (!flash_) return;
  // The copy's own cost (the all-reduce above mostly waits for the slowest rank, which the next
  // gradient all-reduce would wait for anyway).
  const auto t0 = Clock::now();
  write_flash(ckpt::partial_checkpoint_file_name(epoch, global_step_),
              ckpt::encode_checkpoint(build_checkpoint(epoch, epoch_step, tot)));
  flash_secs_ += seconds_since(t0);
  ++flash_writes_;
}

void Trainer::write_flash(const std::string& name, const std::vector<uint8_t>& bytes) {
  try {
    flash_->write(name, bytes);
  } catch (const SystemError& e) {
    log_warning("flash copies are off from step {} on: {} (raise dlaunch's --flash_limit; disk "
                "checkpoints go on)",
                global_step_, e.what());
    flash_.reset();
  }
}

ckpt::Checkpoint Trainer::build_checkpoint(int64_t epochs_done, int64_t epoch_step,
                                           const double* epoch_totals) {
  ckpt::Checkpoint ck;
  ck.meta = {{"format", "dtrain"},
             {"run_id", run_id_},
             {"epoch", epochs_done},
             {"step", global_step_},
             {"optimizer_steps", optimizer_->step_count()},
             {"world_size", pg_.size()},
             {"batch_size", c_.batch_size},
             {"signature", model_signature(c_, train_set_, model_->config())},
             {"config", config_json(c_)},
             // The sampler and augmentation are pure functions of (seed, epoch, index): the
             // next epoch and the seed are their whole state, whatever the world size; inside
             // an epoch, the steps done (with this world and batch size) say where to go on.
             {"sampler", {{"seed", c_.seed}, {"next_epoch", epochs_done}, {"shuffle", true}}},
             {"rng", {{"seed", c_.seed}, {"kind", "splitmix64 counter-based"}}}};
  if (epoch_step > 0) {
    ck.meta["epoch_step"] = epoch_step;
    // The epoch began here after a prefix trained by another world: epoch_step counts from there.
    if (epoch_seen_before_ > 0) ck.meta["epoch_seen_before"] = epoch_seen_before_;
    ck.meta["epoch_totals"] = {epoch_totals[0], epoch_totals[1], epoch_totals[2]};
  }
  // The last evaluation, so a run that resumes with nothing left to train can still report it.
  if (!std::isnan(summary_.test_accuracy)) {
    ck.meta["test_loss"] = summary_.test_loss;
    ck.meta["test_accuracy"] = summary_.test_accuracy;
  }
  // Host copies: the same file whatever the device (a GPU run resumes on the CPU and back).
  ck.add("params", model_->params_tensor().to_host());
  auto names = model_->buffer_names();
  auto buffers = model_->buffers();
  for (size_t i = 0; i < buffers.size(); ++i) {
    ck.add("buffer." + names[i], buffers[i]->to_host());
  }
  ck.add("optimizer.state", optimizer_->state());
  if (ema_) {
    ck.add("ema", ema_->state());
    ck.meta["ema"] = {{"decay", ema_->decay()}, {"every", ema_->every()}, {"warmup", ema_->warmup()}};
  }
  if (precision_->loss_scaling()) ck.meta["grad_scaler"] = precision_->state_json();
  return ck;
}

TrainSummary Trainer::run() {
  summary_.test_loss = summary_.test_accuracy = std::nan("");
  if (rank0_) {
    std::error_code ec;
    fs::create_directories(c_.output_dir, ec);
    if (ec) {
      throw UsageError(fmt::format("cannot create --output_dir {}: {}", c_.output_dir, ec.message()));
    }
  }
  load_data();
  place_data();
  build_model();
  // Every node's local rank 0 keeps a flash copy (rank 0's node may not be the one that hosts
  // rank 0 after a re-rendezvous); rank 0 reads its node's copy when resuming.
  if (c_.flash_every > 0 && env_.local_rank == 0 && !env_.flash_dir.empty()) {
    try {
      const std::string persist_to =
          c_.output_dir.empty() ? "" : std::filesystem::absolute(c_.output_dir).string();
      flash_ = std::make_unique<ckpt::FlashWriter>(env_.flash_dir, persist_to);
    } catch (const SystemError& e) {
      log_warning("no flash copies: {}", e.what());
    }
  }
  int64_t start_epoch = 0;
  if (auto meta = resume()) start_epoch = continue_from(*meta);
  start_ema();
  loss_finite_at_ = weights_finite_at_ = global_step_;
  if (rank0_) open_metrics();
  heartbeat();
  // From here a stop signal is honoured at the next step boundary (before, there is nothing
  // new to save and it ends the process as it always did), or ends a worker that cannot reach
  // it in time (stop_watchdog.h).
  watch_stop_signals(c_.stop_check_every,
                     env_.shutdown_grace ? std::optional(from_seconds(*env_.shutdown_grace))
                                         : std::nullopt);
  arm_stop_signals(true);
  for (int64_t epoch = start_epoch; epoch < c_.epochs && !stop_; ++epoch) {
    train_epoch(epoch);
    if (epoch == start_epoch && rank0_) log_autotuning();
  }
  stop_watch_settle();  // what is left (the last checkpoint's write) ends by itself
  if (start_epoch >= c_.epochs && rank0_) {
    log_info("nothing to train: the checkpoint already has {} of {} epochs", start_epoch, c_.epochs);
  }
  finish_run();
  return summary_;
}

int64_t Trainer::continue_from(const json& meta) {
  const int64_t start_epoch = meta.value("epoch", int64_t{0});
  global_step_ = meta.value("step", int64_t{0});
  summary_.epochs_done = start_epoch;
  summary_.test_loss = meta.value("test_loss", std::nan(""));
  summary_.test_accuracy = meta.value("test_accuracy", std::nan(""));
  const int64_t epoch_step = meta.value("epoch_step", int64_t{0});
  if (epoch_step > 0) continue_inside_epoch(meta, start_epoch, epoch_step);
  if (rank0_) {
    log_info("resumed from {}: {} epochs and {} steps done{} (saved by a world of {}, now {})",
             summary_.resumed_from, start_epoch, global_step_,
             resume_epoch_step_ > 0
                 ? fmt::format(", continuing epoch {} after its step {}", start_epoch + 1,
                               resume_epoch_step_)
                 : std::string(),
             meta.value("world_size", 0), pg_.size());
  }
  return start_epoch;
}

// The steps done inside the epoch index the shards of the world and batch size that did them:
// the same world skips as many of its batches; another one (or an epoch that began after such a
// change) goes on with the samples of the permutation not trained yet.
void Trainer::continue_inside_epoch(const json& meta, int64_t start_epoch, int64_t epoch_step) {
  const int64_t world = meta.value("world_size", int64_t{0});
  const int64_t batch = meta.value("batch_size", int64_t{0});
  const int64_t seen_before = meta.value("epoch_seen_before", int64_t{0});
  const json totals = meta.value("epoch_totals", json::array({0, 0, 0}));
  for (size_t k = 0; k < 3 && k < totals.size(); ++k) resume_totals_[k] = totals[k].get<double>();
  if (seen_before == 0 && world == pg_.size() && batch == c_.batch_size) {
    resume_epoch_step_ = epoch_step;
    return;
  }
  // The ranks that trained took a prefix of the epoch's permutation (padding aside): the rest
  // is shared among this world (distributed_sampler.h), no sample twice.
  resume_seen_ = std::min<int64_t>(seen_before + epoch_step * batch * world, train_set_.size() - 1);
  if (rank0_) {
    log_info("the checkpoint stopped inside epoch {} with {} worker(s) of batch {}; now {} "
             "of batch {}: the epoch goes on with the {} of its {} samples not trained yet",
             start_epoch + 1, world, batch, pg_.size(), c_.batch_size,
             train_set_.size() - resume_seen_, train_set_.size());
  }
}

void Trainer::open_metrics() {
  metrics_ = std::make_unique<metrics::MetricsLog>((fs::path(c_.output_dir) / "metrics.jsonl").string(),
                                                   env_.restart_count);
  if (c_.dataset == "imagefolder") {
    // What was read, for a later look at a run: the bad images skipped are named here too.
    json skipped = json::array();
    for (const auto* ds : {&train_set_, &test_set_}) {
      for (const auto& f : ds->skipped_bad_images) skipped.push_back(f);
    }
    metrics_->write({{"kind", "data"},
                     {"data_dir", c_.data_dir},
                     {"classes", train_set_.classes},
                     {"train_images", train_set_.size()},
                     {"test_images", test_set_.size()},
                     {"ignored_files", train_set_.ignored_files + test_set_.ignored_files},
                     {"skipped_bad_images", skipped.size()},
                     {"skipped_bad_image_files", skipped}});
  }
  // Where this run or attempt goes on from: the records after this step written before it are
  // of steps lost and redone now (the plot drops them: svg_plot.h).
  metrics_->write({{"kind", "start"}, {"step", global_step_}, {"epochs_done", summary_.epochs_done},
                   {"world_size", pg_.size()}});
  // After the start record: the history it is rebuilt from then leaves out the steps redone now.
  if (c_.tensorboard) {
    tensorboard_ = std::make_unique<metrics::TensorBoardLog>(
        c_.output_dir, metrics::surviving_records(metrics::read_metrics(metrics_->path())));
  }
  // Under dlaunch stdout is a pipe; DLAUNCH_CONSOLE_TTY says it ends on a terminal anyway.
  progress_ = metrics::ProgressBar(metrics::stdout_is_terminal() || env_.console_tty);
}

void Trainer::record_metrics(const json& record) {
  const json written = metrics_->write(record);
  if (tensorboard_) tensorboard_->write(written);
}

// The first epoch pays for choosing the convolution algorithms; say how much, so a slow first
// epoch is not mistaken for the training speed.
void Trainer::log_autotuning() {
  const kernels::ConvAutotuneStats t = backend_.conv_autotune_stats();
  if (t.tuned + t.reused > 0) {
    log_info("convolution autotuning: {} passes tuned in {:.1f} s ({} trial runs), {} taken from "
             "earlier choices{}",
             t.tuned, t.seconds, t.trial_runs, t.reused,
             t.cache_path.empty() ? std::string(" (no cache file)") : " and " + t.cache_path);
  }
}

void Trainer::finish_run() {
  if (rank0_ && stop_checks_ > 0) {
    log_debug("stop-signal agreement: {} all-reduces, {:.1f} us each on average", stop_checks_,
              1e6 * stop_check_secs_ / static_cast<double>(stop_checks_));
  }
  summary_.steps = global_step_;
  persister_.wait();  // the checkpoints handed to the background writer are on disk
  if (rank0_ && precision_->loss_scaling()) {
    log_info("fp16 loss scale {:g}; {} optimizer step(s) skipped for inf/NaN gradients", precision_->loss_scale(),
             precision_->skipped_steps());
  }
  if (rank0_ && flash_writes_ > 0) {
    log_info("flash copies: {} mid-epoch writes{}, {:.2f} ms each on average", flash_writes_,
             flash_ ? " to " + flash_->dir() : std::string(" (turned off on the way)"),
             1e3 * flash_secs_ / static_cast<double>(flash_writes_));
  }
  if (rank0_) {
    std::string svg = (fs::path(c_.output_dir) / "curves.svg").string();
    metrics::write_curves_svg(svg, metrics::read_metrics(metrics_->path()),
                              fmt::format("dtrain resnet{} width {} on {}, {} worker(s)", c_.depth(),
                                          c_.width, c_.dataset, pg_.size()));
    log_info("wrote {} and {}", metrics_->path(), svg);
  }
}

}  // namespace

TrainSummary run_training(const TrainConfig& config, const WorkerEnv& env, comm::ProcessGroup& pg,
                          kernels::Backend& backend, const FaultInjection& fault) {
  Trainer t(config, env, pg, backend, fault);
  return t.run();
}

}  // namespace dlaunch::train
