// dtrain's command line: parsed once into a validated TrainConfig. Every flag is spelled with
// underscores as in the issue (--batch_size) and also accepted with dashes (--batch-size); values
// follow "=" or come as the next argument; boolean flags may stand alone (--sync_bn) or take
// =true/false. Bad input throws UsageError with a sentence that names the flag, the value and
// what is allowed (dtrain exits 2 on it).
//
// The defaults are chosen so that a bare `dlaunch --standalone --nproc_per_node=2 dtrain` trains
// something small and visibly learning in about a minute on 2 cores: ResNet-18 at width 16 on the
// synthetic set for 3 epochs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlaunch::train {

struct TrainConfig {
  // --recipe (train/recipe.h): the preset applied before the command line, the "--flag=value"
  // settings it made, and those of them the command line overrode (as given there).
  std::string recipe = "none";
  std::vector<std::string> recipe_settings;
  std::vector<std::string> recipe_overrides;
  std::string model = "resnet18";  // resnet18 | resnet34
  int width = 16;
  std::string dataset = "synthetic";  // cifar10 | mnist | imagefolder | synthetic
  std::string data_dir = "data";
  bool data_dir_given = false;  // --data_dir was on the command line
  int epochs = 3;
  int batch_size = 64;  // per worker
  double lr = 0.1;
  std::string lr_schedule = "cosine";  // cosine | step | constant | triangle
  double warmup_epochs = 0;
  // --warmup_epochs=P%: P percent of --epochs (-1: given in epochs); parse_train_args resolves it
  // into warmup_epochs once --epochs is known, so a recipe's warm-up follows an --epochs override.
  double warmup_percent = -1;
  std::string optimizer = "sgd";  // sgd | adam
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 5e-4;
  bool no_bn_weight_decay = false;  // no weight decay for BN weights/biases and the fc bias
  double bn_lr_scale = 1;           // BN weights'/biases' learning rate x this
  double label_smoothing = 0;     // [0, 1): CrossEntropyLoss(label_smoothing=) in training
  int64_t cutout = 0;             // training: a cutout x cutout square set to the mean (0: off)
  bool alternating_flip = false;  // training: each sample's flip inverted every other epoch
  std::string tta = "none";       // none | flip: test-time augmentation in evaluation
  double ema = 0;                 // (0, 1): EMA of the weights with this decay per step (0: off)
  int64_t ema_every = 1;          // --ema: average every this many steps (decay^K each time)
  bool ema_warmup = false;        // --ema: decay min(DECAY, (1 + t) / (10 + t)) at step t
  bool scale_lr = false;
  bool sync_bn = false;
  uint64_t seed = 0;
  std::string output_dir = "dtrain_output";
  std::string resume = "auto";  // auto | none | PATH
  bool overwrite = false;       // start a new run, deleting the checkpoints in output_dir
  int eval_every = 1;           // epochs; 0 = only after the last epoch
  int threads = 0;              // 0 = OMP_NUM_THREADS, else cores / local world size
  std::string device = "auto";     // auto | cpu | cuda (kernels/device.h)
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (train/precision.h)
  std::string data_on_device = "auto";  // auto | on | off (train/data_placement.h)
  // Seconds a collective may take before the worker gives up on it (exit 1, naming it) so the
  // agent restarts the group; joining the group waits max(this, 300 s).
  double collective_timeout = 300;
  // Survive a peer rank's death in process (train/rank_recovery.h) when the agent offers it
  // (DLAUNCH_RECOVERY_KEY); off: exit on it as before, so the agent restarts the whole group.
  bool rank_recovery = true;
  // When the group shrinks in process (a node lost): per_rank keeps each rank's --batch_size (the
  // global batch shrinks with the world); global keeps the global batch, each rank taking
  // global / world (rounded down when it does not divide).
  std::string elastic_batch = "per_rank";
  int log_every = 20;           // steps; 0 = epoch lines only
  bool tensorboard = true;      // metrics.jsonl's scalars also as a TensorBoard event file
  int64_t max_steps = 0;        // 0 = no limit
  // Steps between flash copies of the training state into DLAUNCH_FLASH_DIR (dlaunch's flash
  // directory; none without it). 0 = off.
  int64_t flash_every = 20;
  bool no_augment = false;
  bool skip_bad_images = false;  // imagefolder: skip images that fail to decode (counted)
  int64_t image_size = 0;        // imagefolder: 0 = the images' own size, else S x S (resized)
  int64_t max_decoded_mib = 4096;  // imagefolder: larger splits decode per epoch (0: never)
  std::string stem = "auto";     // auto (imagenet for images >= 64 pixels) | imagenet | cifar
  // Test knobs, not flags: dtrain's main fills them from DTRAIN_LIMIT_TRAIN_SAMPLES and
  // DTRAIN_LIMIT_TEST_SAMPLES so integration tests run whole epochs in seconds. 0 = everything.
  int64_t limit_train_samples = 0;
  int64_t limit_test_samples = 0;
  // DTRAIN_STOP_CHECK_EVERY: the ranks agree on a stop signal every this many steps (one
  // all-reduce of one number; see docs/dtrain.md, Preemption). >= 1.
  int64_t stop_check_every = 1;

  int depth() const { return model == "resnet34" ? 34 : 18; }
  bool augment() const { return !no_augment && dataset != "mnist"; }
};

// Parses argv[1..]; `help` is set when --help/-h was given (the config is then the defaults).
TrainConfig parse_train_args(const std::vector<std::string>& args, bool* help);
// Throws UsageError (exit 2) when the data directory is missing or not a directory: for
// cifar10 and mnist always, for synthetic (which reads no files) when --data_dir was given. For
// imagefolder --data_dir may also be a file (a tar archive; the loader checks what it holds).
void check_data_dir(const TrainConfig& config);
// The --help text with every flag and its default.
std::string train_usage();
// For the start-up log: "--recipe cifar-fast: --model=resnet18 ...; overridden by the command
// line: --epochs=2" ("" without a recipe).
std::string describe_recipe(const TrainConfig& config);

}  // namespace dlaunch::train
