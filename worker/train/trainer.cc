#include "worker/train/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <optional>

#include "common/error.h"
#include "common/heartbeat.h"
#include "common/log.h"
#include "common/rank_recovery.h"
#include "kernels/backend.h"
#include "worker/data/dataset.h"
#include "worker/data/distributed_sampler.h"
#include "worker/ddp/data_parallel.h"
#include "worker/metrics/progress_bar.h"
#include "worker/model/resnet.h"
#include "worker/optim/lr_schedule.h"
#include "worker/optim/optimizer.h"
#include "worker/optim/weight_ema.h"
#include "worker/train/checkpointing.h"
#include "worker/train/data_placement.h"
#include "worker/train/divergence.h"
#include "worker/train/epoch_batches.h"
#include "worker/train/epoch_run.h"
#include "worker/train/epoch_totals.h"
#include "worker/train/peer_state.h"
#include "worker/train/precision.h"
#include "worker/train/prepared_start.h"
#include "worker/train/rank_recovery.h"
#include "worker/train/resume.h"
#include "worker/train/run_metrics.h"
#include "worker/train/sample_log.h"
#include "worker/train/startup_phases.h"
#include "worker/train/step_sums.h"
#include "worker/train/stop_signal.h"
#include "worker/train/training_data.h"
#include "worker/train/worker_runtime.h"

namespace dlaunch::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class Trainer {
 public:
  Trainer(const TrainConfig& config, const WorkerEnv& env, comm::ProcessGroup& pg,
          kernels::Backend& backend, const FaultInjection& fault, RankRecovery* recovery,
          PreparedStart* prepared)
      : config_(config),
        env_(env),
        pg_(pg),
        backend_(backend),
        fault_(fault),
        recovery_(recovery),
        prepared_(prepared),
        rank0_(pg.rank() == 0),
        batch_size_(config.batch_size),
        samples_(SampleLog::from_env()),
        checkpoints_(config, pg) {}

  TrainSummary run();

 private:
  void load_data();
  // --data_on_device: keeps both splits on the backend (uploaded here, once per process) or not.
  void place_data();
  void build_model();
  // Takes what `point` says of the run's position; returns the epoch to start with.
  int64_t continue_from(const ResumePoint& point);
  // --ema: the average starts from the resumed checkpoint's when it has one (`resumed_ema`),
  // else from the weights (fresh or resumed).
  void start_ema(std::vector<float> resumed_ema);
  // Rank 0's BN running statistics (the model's and the EMA's) on every rank.
  void broadcast_buffers();
  void log_autotuning();
  // After the last epoch: checkpoints on disk, the figures logged, the curves drawn.
  void finish_run();
  // `resumed`: where a stopped epoch goes on (all zero: from its start).
  void train_epoch(int64_t epoch, const EpochResume& resumed);
  // The epoch's sample indices for this rank in this world: the rest after the first `seen`
  // entries of its permutation (0: all), less the first `skip_steps` batches (a resume).
  std::vector<int64_t> epoch_indices(EpochRun& run, int64_t seen, int64_t skip_steps);
  // One batch: train_step and after_step. With rank-level recovery a peer's death inside them is
  // survived: the step is rolled back and redone on the re-formed group with the same batch, or,
  // when its optimizer step had run, the rest of its after_step is left out. After a shrink
  // (shrunk_from_ set) a rolled-back step is not redone: the epoch's rest is shared anew.
  void run_step(EpochRun& run, const data::Batch& batch);
  // After a shrink: this rank's new duties and batch (take_new_seat), then the rest of the epoch
  // from the exact sample position, shared among the smaller world (`batches` replaced).
  void continue_after_shrink(EpochRun& run, std::optional<EpochBatches>& batches);
  // The group re-formed with this worker at another rank or world size: rank 0's duties (the
  // metrics, the progress line; checkpoints follow the group by themselves), the per-rank batch
  // (--elastic_batch) and the learning rate's scale follow.
  void take_new_seat();
  // Each rank's batch in a world of `world` ranks: --batch_size, or with --elastic_batch global
  // the kept global batch / world, rounded down (at least 1).
  int64_t batch_for_world(int world) const;
  // --scale_lr: the learning rate times the world size, or with --elastic_batch global times the
  // world that set the global batch (the global batch is kept, so is the rate).
  void scale_learning_rate();
  // DTRAIN_LOG_SAMPLES: the indices of `batch`, a step this rank completed (or took from a peer).
  void log_samples(const EpochRun& run, const data::Batch& batch);
  // The first step of this process, and the first after a re-form, are timed at debug level
  // (startup_phases.h): they end a replacement's start-up and a survivor's recovery.
  void say_first_step_done();
  // What a step changes before its optimizer step, and what a redo would change again: the BN
  // running statistics (forward in training mode) and the step sums (the loss op). The rest (the
  // weights, the optimizer, fp16's loss scale, the EMA) changes only after the last collective
  // of the gradients, with the optimizer step.
  struct StepStart {
    std::vector<std::vector<float>> bn_buffers;
    StepSums::Saved sums;
  };
  StepStart save_step_start();
  void restore_step_start(const StepStart& start);
  // After a peer's death in a step (`complete`: its optimizer step had run): the group dropped
  // and re-formed, the state shared with the replacement. True when the step is done (here, or
  // by the peers whose newer state this rank took): go on with the next batch.
  bool recover_step(EpochRun& run, const std::exception_ptr& error, bool complete,
                    const StepStart& start);
  // Another survivor completed the step this one did not (the peer died inside the step's last
  // collective): its state, loaded by the exchange, is this step done. Throws when it is not
  // exactly one step ahead.
  void adopt_peer_step(EpochRun& run, ResumePoint point);
  // One optimizer step on `batch`, its figures added to the step sums.
  void train_step(EpochRun& run, const data::Batch& batch);
  // After a step: the logging window, the progress bar, a flash copy, fault injection.
  void after_step(EpochRun& run);
  void log_window(EpochRun& run);
  // FaultInjection: raises its signal when this is the rank and the step.
  void inject_fault();
  void finish_epoch(EpochRun& run);
  // A stop signal ended the epoch: a checkpoint inside it, no evaluation.
  void finish_stopped_epoch(EpochRun& run, const EpochFigures& figures);
  void report_epoch(const EpochRun& run, const EpochFigures& figures,
                    const std::optional<std::pair<double, double>>& test, double epoch_secs);
  // Every rank: whether any rank received a stop signal (the largest signal number, 0: none).
  // One all-reduce of one number.
  int agree_stop();
  // Every rank, at the same points, with figures summed over the ranks (divergence.h).
  void check_finite(std::optional<double> loss_sum, std::optional<double> bad_weights) {
    divergence_->check(global_step_, loss_sum, bad_weights);
  }
  // This rank's count of inf/NaN weights (one read of one number from the backend).
  double count_non_finite_weights();
  std::pair<double, double> evaluate();  // mean loss, accuracy
  // --flash_every, every rank: the epoch's totals so far summed over the ranks (and checked),
  // then the flash copy on the ranks that keep one.
  void save_flash(const EpochRun& run);
  // What a checkpoint written now holds.
  TrainingState state();

  const TrainConfig& config_;
  const WorkerEnv& env_;
  comm::ProcessGroup& pg_;
  kernels::Backend& backend_;  // where the model, its gradients and the optimizer state live
  FaultInjection fault_;
  RankRecovery* recovery_;  // null: a peer's death ends this worker
  PreparedStart* prepared_;  // what a replacement made ready while joining; null: nothing
  bool rank0_;  // follows the group's rank: a shrink may move rank 0's duties to this worker
  // Each rank's batch now: --batch_size, or after a shrink with --elastic_batch global the kept
  // global batch shared among the smaller world.
  int64_t batch_size_;
  int64_t global_batch_ = 0;  // --elastic_batch global: the global batch kept (0: per_rank)
  int shrunk_from_ = 0;       // set by recover_step when the group re-formed smaller: the old world
  SampleLog samples_;         // DTRAIN_LOG_SAMPLES (test-only)
  std::vector<int64_t> shard_;  // with the sample log: the epoch's indices as the batches take them
  size_t shard_next_ = 0;
  std::string run_id_;  // this run's (resume.h), for the state sent to a replacement

  data::ImageDataset train_set_, test_set_;
  std::unique_ptr<ResidentSplit> resident_train_, resident_test_;  // null: the host loader
  std::unique_ptr<model::ResNet> model_;
  std::unique_ptr<ddp::DataParallel> data_parallel_;
  std::unique_ptr<StepSums> step_sums_;  // the steps' loss and accuracy, where the steps run
  double live_loss_ = 0;  // rank 0's progress line: the loss of the latest window read
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::WeightEma> ema_;      // --ema; null when off
  std::unique_ptr<MixedPrecision> precision_;  // --precision: rounding, fp16's loss scale
  optim::LrSchedule schedule_;
  RunMetrics metrics_;  // rank 0
  metrics::ProgressBar progress_{false};
  Tensor images_;  // the batch: on the host, or on backend_ with data on the device
  int64_t global_step_ = 0;
  int64_t steps_this_process_ = 0;
  std::optional<Clock::time_point> recovering_since_;  // a peer's failure this rank recovers from
  std::optional<DivergenceCheck> divergence_;  // from the start (or resume) of the training on
  bool stop_ = false;
  int stop_signal_ = 0;
  // The cost of agreeing on stop signals: all-reduces and the seconds they took.
  int64_t stop_checks_ = 0;
  double stop_check_secs_ = 0;
  TrainSummary summary_;
  Checkpointer checkpoints_;
};

void Trainer::load_data() {
  data::DatasetSplits splits = prepared_ != nullptr ? std::move(prepared_->splits)
                                                    : load_training_data(config_, env_, rank0_);
  train_set_ = std::move(splits.train);
  test_set_ = std::move(splits.test);
}

void Trainer::place_data() {
  const DataPlacement placement = choose_data_placement(
      config_.data_on_device, backend_.host_accessible(), train_set_, test_set_);
  if (!placement.on_device) {
    if (rank0_) log_info("data: batches assembled on the host ({})", placement.reason);
    return;
  }
  const auto start = Clock::now();
  resident_train_ = std::make_unique<ResidentSplit>(backend_, train_set_);
  resident_test_ = std::make_unique<ResidentSplit>(backend_, test_set_);
  images_ = Tensor(backend_);
  if (rank0_) {
    log_info(
        "data: kept on {} as uint8, uploaded in {:.2f} s ({}); each step copies only "
        "the sample indices and augments there",
        backend_.name(), seconds_since(start), placement.reason);
  }
}

void Trainer::build_model() {
  const model::ResNetConfig model_config = resnet_config(config_, train_set_);
  const bool imagenet_stem = model_config.stem == model::ResNetStem::kImageNet;
  precision_ = std::make_unique<MixedPrecision>(model_config.precision, backend_);
  model_ = prepared_ != nullptr && prepared_->model
               ? std::move(prepared_->model)
               : std::make_unique<model::ResNet>(model_config, config_.seed, backend_);
  data_parallel_ = std::make_unique<ddp::DataParallel>(*model_, pg_, config_.sync_bn);
  step_sums_ = std::make_unique<StepSums>(backend_);
  data_parallel_->set_label_smoothing(static_cast<float>(config_.label_smoothing));
  data_parallel_->set_tta_flip(config_.tta == "flip");
  // A survivor abandons its step as soon as the agent announces a replacement, instead of
  // computing the rest of it first (rank_recovery.h's watch).
  if (recovery_ != nullptr) {
    data_parallel_->set_interrupt_check([this] { recovery_->abandon_step_if_replacing(); });
  }

  optim::OptimConfig optim_config;
  optim_config.kind = optim::parse_optim_kind(config_.optimizer);
  optim_config.momentum = config_.momentum;
  optim_config.nesterov = config_.nesterov;
  optim_config.weight_decay = config_.weight_decay;
  optim_config.decay_bn_and_bias = !config_.no_bn_weight_decay;
  optim_config.bn_lr_scale = config_.bn_lr_scale;
  optimizer_ = std::make_unique<optim::Optimizer>(optim_config, backend_);

  schedule_.kind = optim::parse_lr_schedule(config_.lr_schedule);
  scale_learning_rate();
  schedule_.warmup_epochs = config_.warmup_epochs;
  schedule_.total_epochs = config_.epochs;
  if (rank0_) {
    log_info(
        "model: resnet{} width {}, {} stem ({}; {}), {} parameters, {} gradient buckets; world "
        "size {} ({}), SyncBN {}, {} threads per worker, on {}",
        config_.depth(), config_.width, model::stem_name(model_config.stem),
        imagenet_stem ? "7x7 conv stride 2 + 3x3 max-pool stride 2"
                      : "3x3 conv stride 1, no max-pool",
        config_.stem == "auto" ? "--stem auto by image size" : "--stem", model_->num_params(),
        data_parallel_->reducer().buckets().size(), pg_.size(), pg_.backend(),
        config_.sync_bn ? "on" : "off", kernels::host_threads(), backend_.name());
    log_info("{}", precision_->describe());
  }
}

double Trainer::count_non_finite_weights() {
  // x * 1 leaves every value as it was: the op only counts here.
  return static_cast<double>(backend_.unscale_count_non_finite(
      static_cast<int64_t>(model_->num_params()), 1.0f, model_->params()));
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

void Trainer::train_epoch(int64_t epoch, const EpochResume& resumed) {
  EpochRun run;
  run.epoch = epoch;
  std::optional<EpochBatches> batches;
  batches.emplace(train_set_, resident_train_.get(),
                  epoch_indices(run, resumed.seen, resumed.skip_steps), batch_size_,
                  config_.augment(), config_.seed, epoch,
                  data::AugmentRecipe{config_.cutout, config_.alternating_flip});
  run.start = run.window_start = Clock::now();
  if (rank0_) run.totals = resumed.totals;
  run.resumed_images = run.totals.samples;
  step_sums_->begin_epoch(run.totals);
  run.learning_rate = optim::lr_at(schedule_, static_cast<double>(epoch) + run.fraction(run.step));
  while (auto batch = batches->next(images_)) {
    run_step(run, *batch);
    if (shrunk_from_ != 0) continue_after_shrink(run, batches);
    if (stop_signal_ != 0 || (config_.max_steps > 0 && global_step_ >= config_.max_steps)) {
      stop_ = true;
      break;
    }
  }
  finish_epoch(run);
}

std::vector<int64_t> Trainer::epoch_indices(EpochRun& run, int64_t seen, int64_t skip_steps) {
  data::DistributedSampler sampler(train_set_.size(), pg_.size(), pg_.rank(), /*shuffle=*/true,
                                   config_.seed, /*drop_last=*/false);
  // After a re-form at another world size, the rest of the epoch's samples, shared anew.
  run.seen_before = seen;
  std::vector<int64_t> indices = run.seen_before > 0
                                     ? sampler.indices_after(run.epoch, run.seen_before)
                                     : sampler.indices(run.epoch);
  run.steps = (static_cast<int64_t>(indices.size()) + batch_size_ - 1) / batch_size_;
  run.n_train = static_cast<double>(train_set_.size());
  // Resuming inside this epoch: the sampler's order is a pure function of (seed, epoch), so
  // skipping the batches already trained continues exactly where the stop happened.
  run.step = std::min(skip_steps, run.steps);
  indices.erase(indices.begin(),
                indices.begin() + std::min<int64_t>(run.step * batch_size_,
                                                    static_cast<int64_t>(indices.size())));
  if (samples_.on()) {
    shard_ = indices;
    shard_next_ = 0;
  }
  return indices;
}

void Trainer::continue_after_shrink(EpochRun& run, std::optional<EpochBatches>& batches) {
  const int old_world = std::exchange(shrunk_from_, 0);
  // The ranks took the shards' batches in step, so the steps done cover exactly a prefix of the
  // epoch's permutation (padding only ever comes in an epoch's last step):
  // distributed_sampler.h's indices_after.
  const int64_t seen = run.seen_before + run.step * batch_size_ * old_world;
  take_new_seat();
  if (run.step >= run.steps || seen >= train_set_.size()) return;  // its samples are all done
  batches.emplace(train_set_, resident_train_.get(), epoch_indices(run, seen, 0), batch_size_,
                  config_.augment(), config_.seed, run.epoch,
                  data::AugmentRecipe{config_.cutout, config_.alternating_flip});
  if (rank0_) {
    log_info("epoch {} goes on after {} of its {} samples, shared among {} ranks: {} steps of {} "
             "per rank",
             run.epoch + 1, seen, train_set_.size(), pg_.size(), run.steps, batch_size_);
  }
}

void Trainer::take_new_seat() {
  const bool was_rank0 = rank0_;
  rank0_ = pg_.rank() == 0;
  set_log_tag(fmt::format("dtrain rank {}", pg_.rank()));
  const int64_t batch = batch_for_world(pg_.size());
  if (batch != batch_size_) {
    log_info("--elastic_batch global: each rank's batch is now {} (was {}){}", batch, batch_size_,
             global_batch_ % pg_.size() == 0
                 ? fmt::format(", the global batch {} kept", global_batch_)
                 : fmt::format("; the global batch {} does not divide among {} ranks, so it is "
                               "{} now",
                               global_batch_, pg_.size(), batch * pg_.size()));
    batch_size_ = batch;
  }
  scale_learning_rate();
  if (rank0_ && !was_rank0) {
    log_info("this worker is rank 0 now: it writes the metrics and the checkpoints");
    metrics_.open(config_, env_.restart_count, train_set_, test_set_, global_step_,
                  summary_.epochs_done, pg_.size());
    progress_ = metrics::ProgressBar(metrics::stdout_is_terminal() || env_.console_tty);
  }
}

int64_t Trainer::batch_for_world(int world) const {
  if (global_batch_ == 0) return config_.batch_size;
  return std::max<int64_t>(1, global_batch_ / world);
}

void Trainer::scale_learning_rate() {
  const int64_t lr_world = global_batch_ > 0 ? global_batch_ / config_.batch_size : pg_.size();
  schedule_.base_lr = config_.lr * static_cast<double>(config_.scale_lr ? lr_world : 1);
}

void Trainer::log_samples(const EpochRun& run, const data::Batch& batch) {
  if (!samples_.on()) return;
  samples_.record(run.epoch, global_step_, pg_.size(), shard_, shard_next_,
                  static_cast<size_t>(batch.size));
  shard_next_ += static_cast<size_t>(batch.size);
}

void Trainer::say_first_step_done() {
  if (steps_this_process_++ == 0) log_startup_phase(fmt::format("step {} done", global_step_));
  if (recovering_since_) {
    log_debug("step {} done {:.0f} ms after the failure", global_step_,
              1e3 * seconds_since(*recovering_since_));
    recovering_since_.reset();
  }
}

void Trainer::run_step(EpochRun& run, const data::Batch& batch) {
  if (recovery_ == nullptr) {
    train_step(run, batch);
    after_step(run);
    say_first_step_done();
    return;
  }
  for (;;) {
    const StepStart start = save_step_start();
    const int64_t step_before = global_step_;
    std::exception_ptr error;
    try {
      train_step(run, batch);
      after_step(run);
      say_first_step_done();
      return;
    } catch (const Error& e) {
      if (!is_peer_failure(e)) throw;
      error = std::current_exception();
    }
    // The optimizer step ran (global_step_ counts it): the failure came later, in the stop
    // agreement, the logging window or the flash copy, none of which changes the training.
    const bool complete = global_step_ > step_before;
    const bool done = recover_step(run, error, complete, start);
    if (done && !complete) log_samples(run, batch);  // a peer's state: this batch's step done
    // After a shrink a step not done is not redone at the old size: its samples are in the
    // epoch's rest, which the smaller world shares anew (train_epoch).
    if (done || shrunk_from_ != 0) return;
  }
}

Trainer::StepStart Trainer::save_step_start() {
  StepStart start;
  for (Tensor* t : model_->buffers()) start.bn_buffers.push_back(t->to_host());
  start.sums = step_sums_->save();
  return start;
}

void Trainer::restore_step_start(const StepStart& start) {
  const std::vector<Tensor*> buffers = model_->buffers();
  for (size_t i = 0; i < buffers.size(); ++i) buffers[i]->copy_from_host(start.bn_buffers[i].data());
  step_sums_->restore(start.sums);
}

bool Trainer::recover_step(EpochRun& run, const std::exception_ptr& error, bool complete,
                           const StepStart& start) {
  progress_.clear();
  if (!recovering_since_) recovering_since_ = Clock::now();
  // First the group: its destruction waits for the async gradient all-reduces still running,
  // which write into the gradients; then nothing of the step is in flight.
  recovery_->drop_group();
  data_parallel_->abandon_step();
  if (!complete) restore_step_start(start);
  log_info("step {} {}: re-forming the group", global_step_ + (complete ? 0 : 1),
           complete ? "was complete when the peer failed (the rest of its logging is left out)"
                    : "was interrupted and is rolled back (redone with the same batch, or, if "
                      "the group shrinks, its samples shared anew)");
  const int rank = pg_.rank();
  const int world = pg_.size();
  if (fault_.stall_in_reform_rank == rank) {
    fault_.stall_in_reform_rank = -1;
    log_warning("fault injection: stopping rank {} as it begins to re-form "
                "(DTRAIN_STALL_IN_REFORM)",
                rank);
    std::raise(SIGSTOP);
  }
  bool took_step = false;
  recovery_->reform(error, [&] {
    // The replacement starts after this step, as a checkpoint written now would say; the epoch's
    // totals are not sent: each rank keeps its own, and the dead rank's are lost (docs/dtrain.md).
    const CheckpointPosition at{run.epoch, run.step, run.seen_before, EpochTotals{}};
    std::optional<ResumePoint> received;
    const PeerStateResult result = exchange_state_as_survivor(
        config_, pg_, train_set_, {*model_, *data_parallel_, *optimizer_, *precision_},
        global_step_,
        [&] { return encode_training_state(config_, run_id_, pg_.size(), state(), at); },
        &received);
    // Taken whole even if the exchange then failed on another rank: this rank holds that state
    // now, and offers it as such in the next generation's exchange.
    if (received) {
      adopt_peer_step(run, std::move(*received));
      took_step = true;
    }
    if (result.outcome != PeerStateOutcome::kFailed) return true;
    if (result.group_broken) return false;
    throw PeerStateError(fmt::format("sharing the training state after a re-form failed: {}",
                                     result.error));
  });
  if (pg_.rank() != rank || pg_.size() != world) shrunk_from_ = world;
  return complete || took_step;
}

void Trainer::adopt_peer_step(EpochRun& run, ResumePoint point) {
  const int64_t expected_step = run.step + 1;
  if (point.epochs_done != run.epoch || point.inside_epoch.skip_steps != expected_step ||
      point.global_step != global_step_ + 1) {
    throw Error(fmt::format(
        "after the re-form this rank was at step {} (epoch {}, step {} in it) but a peer's newer "
        "state is at step {} (epoch {}, step {} in it); expected one step ahead: the ranks cannot "
        "agree where to go on, so the group restarts",
        global_step_, run.epoch + 1, run.step, point.global_step, point.epochs_done + 1,
        point.inside_epoch.skip_steps));
  }
  if (ema_ && !point.ema.empty()) ema_->load_state(std::move(point.ema));
  global_step_ = point.global_step;
  run.step = expected_step;
  log_info("took step {} from a peer that completed it", global_step_);
}

void Trainer::train_step(EpochRun& run, const data::Batch& batch) {
  run.learning_rate =
      optim::lr_at(schedule_, static_cast<double>(run.epoch) + run.fraction(run.step));
  data_parallel_->train_step_into(images_, batch.labels.data(), precision_->loss_scale(),
                                  step_sums_->sums(), StepSums::kTriples);
  if (precision_->finish_step(model_->grads(), model_->num_params())) {
    optimizer_->step(model_->params(), model_->grads(), model_->num_params(),
                     static_cast<float>(run.learning_rate), model_->param_info());
    if (ema_) ema_->after_step(optimizer_->step_count());
  }
  ++global_step_;
  ++run.step;
  run.images += static_cast<double>(batch.size);
  log_samples(run, batch);
  if (fault_.after_optimizer) inject_fault();
  heartbeat();
  stop_watch_progress(/*step=*/true);
  // Every rank learns of a signal any rank got, after the same step: the checkpoint below is
  // then the state of every rank.
  if (global_step_ % config_.stop_check_every == 0) stop_signal_ = agree_stop();
}

void Trainer::after_step(EpochRun& run) {
  bool last = run.complete() || (config_.max_steps > 0 && global_step_ >= config_.max_steps) ||
              stop_signal_ != 0;
  if (config_.log_every > 0 && (global_step_ % config_.log_every == 0 || last)) log_window(run);
  if (rank0_) {
    // The window's loss so far where reading it is free (the CPU), else the last window's: a
    // per-step read would make every step wait for the device.
    if (auto loss = step_sums_->free_window_loss()) live_loss_ = *loss;
    progress_.update(run.epoch + 1, run.step, run.steps, live_loss_,
                     run.images * pg_.size() / std::max(seconds_since(run.start), 1e-9));
  }
  if (config_.flash_every > 0 && global_step_ % config_.flash_every == 0 && run.step < run.steps) {
    run.totals = step_sums_->read_totals();
    save_flash(run);
  }
  // After the step's logging, so the metrics show the step the worker died after.
  if (!fault_.after_optimizer) inject_fault();
}

void Trainer::inject_fault() {
  if (fault_.fires(global_step_, pg_.rank())) {
    log_warning("fault injection: {} rank {} after step {}{} (DTRAIN_FAIL_AT_STEP)",
                fault_.signal == SIGSTOP ? "stopping" : "killing", pg_.rank(), global_step_,
                fault_.after_optimizer ? "'s optimizer step" : "");
    std::raise(fault_.signal);
  }
}

void Trainer::log_window(EpochRun& run) {
  // Cleared only once summed: a window whose all-reduce failed (a peer died) is kept, and
  // reported with the next one.
  const EpochTotals window = sum_over_ranks(pg_, step_sums_->read_window());
  step_sums_->clear_window();
  live_loss_ = window.mean_loss();
  double secs = seconds_since(run.window_start);
  double ips = secs > 0 ? window.samples / secs : 0;
  if (rank0_) {
    json rec = {{"kind", "step"},
                {"epoch", run.epoch + 1},
                {"epoch_progress", static_cast<double>(run.epoch) + run.fraction(run.step)},
                {"step", global_step_},
                {"loss", window.mean_loss()},
                {"train_accuracy", window.accuracy()},
                {"lr", run.learning_rate},
                {"images_per_s", ips},
                {"world_size", pg_.size()}};
    if (precision_->loss_scaling()) {  // fp16: the scale after this step, the skips so far
      rec["loss_scale"] = precision_->loss_scale();
      rec["skipped_steps"] = precision_->skipped_steps();
    }
    metrics_.record(rec);
  }
  run.window_start = Clock::now();
  // After the window's record: the metrics show the step the loss went bad at.
  check_finite(window.loss_sum, std::nullopt);
}

void Trainer::finish_epoch(EpochRun& run) {
  run.totals = step_sums_->read_totals();  // waits for the epoch's last step
  double train_secs = seconds_since(run.start);
  // Rank 0's resumed totals are counted once: the others add zeros for them. The inf/NaN
  // weights ride along, checked before the evaluation and the checkpoint.
  const TotalsAndWeights all = sum_over_ranks(pg_, run.totals, count_non_finite_weights());
  run.totals = all.totals;
  check_finite(all.totals.loss_sum, all.non_finite_weights);
  EpochFigures figures;
  figures.loss = run.totals.mean_loss();
  figures.accuracy = run.totals.accuracy();
  figures.images_per_s = (run.totals.samples - run.resumed_images) / train_secs;
  if (stop_signal_ != 0) return finish_stopped_epoch(run, figures);

  bool last_epoch = run.epoch + 1 == config_.epochs || stop_;
  bool do_eval =
      last_epoch || (config_.eval_every > 0 && (run.epoch + 1) % config_.eval_every == 0);
  broadcast_buffers();  // rank 0's running statistics for eval and the checkpoint
  // The epoch's end is no longer silent than a step (--hang_timeout auto learns the longest gap
  // between beats): before the evaluation (which beats every batch) and around the checkpoint.
  heartbeat();
  std::optional<std::pair<double, double>> test;
  if (do_eval) test = evaluate();
  double epoch_secs = seconds_since(run.start);
  progress_.clear();
  if (rank0_) report_epoch(run, figures, test, epoch_secs);
  if (test) {
    summary_.test_loss = test->first;
    summary_.test_accuracy = test->second;
  }
  // A checkpoint marks a completed epoch; a --max_steps stop in mid-epoch writes none.
  if (run.complete()) {
    summary_.epochs_done = run.epoch + 1;
    summary_.partial_epoch = summary_.partial_epoch_steps = summary_.partial_epoch_of = 0;
    heartbeat();
    checkpoints_.save(state(), CheckpointPosition{run.epoch + 1});
    heartbeat();
  } else {
    summary_.partial_epoch = run.epoch + 1;
    summary_.partial_epoch_steps = run.step;
    summary_.partial_epoch_of = run.steps;
  }
}

// Preemption: no evaluation (the grace period is short); the checkpoint records the step inside
// the epoch so the requeued run continues from there.
void Trainer::finish_stopped_epoch(EpochRun& run, const EpochFigures& figures) {
  progress_.clear();
  broadcast_buffers();  // rank 0's running statistics for the checkpoint
  summary_.partial_epoch = run.epoch + 1;
  summary_.partial_epoch_steps = run.step;
  summary_.partial_epoch_of = run.steps;
  if (rank0_) {
    fmt::print(
        "epoch {:>3}/{}  stopped by {} after step {} of {}  train loss {:.4f} acc {:6.2f}% "
        "so far\n",
        run.epoch + 1, config_.epochs, stop_signal_name(stop_signal_), run.step, run.steps,
        figures.loss, 100 * figures.accuracy);
    std::fflush(stdout);
  }
  summary_.stop_signal = stop_signal_;
  summary_.stop_checkpoint = checkpoints_.save(state(), run.position());
}

// Rank 0: the epoch's line on stdout and its record in the metrics.
void Trainer::report_epoch(const EpochRun& run, const EpochFigures& figures,
                           const std::optional<std::pair<double, double>>& test,
                           double epoch_secs) {
  std::string test_part =
      test ? fmt::format("test loss {:.4f} acc {:6.2f}%", test->first, 100 * test->second)
           : std::string("test -");
  // A --max_steps stop inside the epoch says so: its figures cover only the steps done.
  std::string partial =
      run.complete() ? std::string()
                     : fmt::format(" (partial: {} of {} steps, --max_steps)", run.step, run.steps);
  fmt::print(
      "epoch {:>3}/{}{}  train loss {:.4f} acc {:6.2f}%  {}  {:.0f} img/s  lr {:.5f}  {:.1f} s\n",
      run.epoch + 1, config_.epochs, partial, figures.loss, 100 * figures.accuracy, test_part,
      figures.images_per_s, run.learning_rate, epoch_secs);
  std::fflush(stdout);
  json rec = {{"kind", "epoch"},
              {"epoch", run.epoch + 1},
              {"step", global_step_},
              {"loss", figures.loss},
              {"train_accuracy", figures.accuracy},
              {"lr", run.learning_rate},
              {"images_per_s", figures.images_per_s},
              {"world_size", pg_.size()},
              {"epoch_time_s", epoch_secs},
              {"complete", run.complete()},
              {"epoch_steps", run.step},
              {"epoch_steps_total", run.steps}};
  if (test) {
    rec["test_loss"] = test->first;
    rec["test_accuracy"] = test->second;
  }
  metrics_.record(rec);
}

void Trainer::broadcast_buffers() {
  data_parallel_->broadcast_buffers();
  if (ema_) {
    for (Tensor* t : ema_->buffers()) ddp::broadcast_tensor(pg_, *t);
  }
}

void Trainer::start_ema(std::vector<float> resumed_ema) {
  if (config_.ema <= 0) return;
  ema_ = std::make_unique<optim::WeightEma>(*model_, config_.ema, config_.ema_every,
                                            config_.ema_warmup);
  const bool resumed = !resumed_ema.empty();
  if (resumed) ema_->load_state(std::move(resumed_ema));
  if (rank0_) {
    log_info(
        "EMA of the weights and BN statistics: decay {} per step{}, averaged every {} step(s); "
        "evaluation uses it; starts from {}",
        config_.ema, config_.ema_warmup ? " (warm-up: min(decay, (1 + t) / (10 + t)))" : "",
        config_.ema_every,
        resumed            ? "the checkpoint's"
        : summary_.resumed ? "the resumed weights (the checkpoint has none)"
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
  EpochBatches batches(test_set_, resident_test_.get(), std::move(mine),
                       std::max(config_.batch_size, 256), false, config_.seed, 0);
  EpochTotals test;
  while (auto batch = batches.next(images_)) {
    const ddp::StepResult result = data_parallel_->eval_step(images_, batch->labels.data());
    test.loss_sum += result.loss;
    test.correct += result.correct;
    test.samples += static_cast<double>(batch->size);
    heartbeat();
    stop_watch_progress(/*step=*/false);
  }
  test = sum_over_ranks(pg_, test);
  return {test.mean_loss(), test.accuracy()};
}

void Trainer::save_flash(const EpochRun& run) {
  // Summed over the ranks (rank 0 carries a resumed epoch's totals), as a stop's checkpoint.
  const TotalsAndWeights all = sum_over_ranks(pg_, run.totals, count_non_finite_weights());
  check_finite(all.totals.loss_sum, all.non_finite_weights);
  // The copy's own cost is counted apart: the all-reduce above mostly waits for the slowest
  // rank, which the next gradient all-reduce would wait for anyway.
  CheckpointPosition at = run.position();
  at.totals = all.totals;
  checkpoints_.save_flash(state(), at);
}

TrainingState Trainer::state() {
  return {*model_,    *optimizer_,  ema_.get(),         *precision_,
          train_set_, global_step_, summary_.test_loss, summary_.test_accuracy,
          batch_size_, global_batch_};
}

TrainSummary Trainer::run() {
  summary_.test_loss = summary_.test_accuracy = std::nan("");
  if (rank0_) {
    std::error_code ec;
    fs::create_directories(config_.output_dir, ec);
    if (ec) {
      throw UsageError(
          fmt::format("cannot create --output_dir {}: {}", config_.output_dir, ec.message()));
    }
  }
  load_data();
  place_data();
  log_startup_phase("data ready");
  build_model();
  log_startup_phase("model built");
  checkpoints_.open_flash(env_);
  ResumePoint point =
      resume(config_, pg_, train_set_, {*model_, *data_parallel_, *optimizer_, *precision_},
             checkpoints_.flash_dir(), env_.replacement);
  log_startup_phase("training state in place");
  // From here this rank holds the training state and can survive a peer's death: the agent may
  // now replace a rank of this group instead of restarting it (a replacement says so only once
  // it took the state from its peers).
  if (recovery_ != nullptr) announce_rank_recovery();
  const int64_t start_epoch = continue_from(point);
  start_ema(std::move(point.ema));
  divergence_.emplace(config_, !precision_->loss_scaling(), global_step_);
  if (rank0_) {
    metrics_.open(config_, env_.restart_count, train_set_, test_set_, global_step_,
                  summary_.epochs_done, pg_.size());
    // Under dlaunch stdout is a pipe; DLAUNCH_CONSOLE_TTY says it ends on a terminal anyway.
    progress_ = metrics::ProgressBar(metrics::stdout_is_terminal() || env_.console_tty);
  }
  heartbeat();
  // From here a stop signal is honoured at the next step boundary (before it there is nothing
  // new to save, and the signal ends the process), or ends a worker that cannot reach it in time
  // (stop_watchdog.h).
  watch_stop_signals(
      config_.stop_check_every,
      env_.shutdown_grace ? std::optional(from_seconds(*env_.shutdown_grace)) : std::nullopt);
  arm_stop_signals(true);
  for (int64_t epoch = start_epoch; epoch < config_.epochs && !stop_; ++epoch) {
    // Only the first epoch trained can be one a stop cut short.
    train_epoch(epoch, epoch == start_epoch ? point.inside_epoch : EpochResume{});
    if (epoch == start_epoch && rank0_) log_autotuning();
  }
  stop_watch_settle();  // what is left (the last checkpoint's write) ends by itself
  if (start_epoch >= config_.epochs && rank0_) {
    log_info("nothing to train: the checkpoint already has {} of {} epochs", start_epoch,
             config_.epochs);
  }
  finish_run();
  return summary_;
}

int64_t Trainer::continue_from(const ResumePoint& point) {
  run_id_ = point.run_id;
  checkpoints_.set_run_id(point.run_id);
  if (config_.elastic_batch == "global") global_batch_ = config_.batch_size * pg_.size();
  // A replacement trains with its peers' batch and keeps their global batch: after a shrink
  // with --elastic_batch global they are not --batch_size and this world's.
  if (env_.replacement && point.resumed && point.saved_world_size == pg_.size() &&
      point.saved_batch_size > 0) {
    batch_size_ = point.saved_batch_size;
    if (global_batch_ > 0 && point.saved_global_batch > 0) global_batch_ = point.saved_global_batch;
  }
  scale_learning_rate();
  if (!point.resumed) return 0;
  summary_.resumed = true;
  summary_.resumed_from = point.checkpoint;
  global_step_ = point.global_step;
  summary_.epochs_done = point.epochs_done;
  summary_.test_loss = point.test_loss;
  summary_.test_accuracy = point.test_accuracy;
  return point.epochs_done;
}

// The first epoch pays for choosing the convolution algorithms; say how much, so a slow first
// epoch is not mistaken for the training speed.
void Trainer::log_autotuning() {
  const kernels::ConvAutotuneStats stats = backend_.conv_autotune_stats();
  if (stats.tuned + stats.reused > 0) {
    log_info(
        "convolution autotuning: {} passes tuned in {:.1f} s ({} trial runs), {} taken from "
        "earlier choices{}",
        stats.tuned, stats.seconds, stats.trial_runs, stats.reused,
        stats.cache_path.empty() ? std::string(" (no cache file)") : " and " + stats.cache_path);
  }
}

void Trainer::finish_run() {
  if (rank0_ && stop_checks_ > 0) {
    log_debug("stop-signal agreement: {} all-reduces, {:.1f} us each on average", stop_checks_,
              1e6 * stop_check_secs_ / static_cast<double>(stop_checks_));
  }
  summary_.steps = global_step_;
  checkpoints_.wait_for_disk();  // the checkpoints handed to the background writer are on disk
  if (rank0_ && precision_->loss_scaling()) {
    log_info("fp16 loss scale {:g}; {} optimizer step(s) skipped for inf/NaN gradients",
             precision_->loss_scale(), precision_->skipped_steps());
  }
  checkpoints_.log_flash_costs();
  if (rank0_) metrics_.draw_curves(config_, pg_.size());
}

}  // namespace

TrainSummary run_training(const TrainConfig& config, const WorkerEnv& env, comm::ProcessGroup& pg,
                          kernels::Backend& backend, const FaultInjection& fault,
                          RankRecovery* recovery, PreparedStart* prepared) {
  Trainer trainer(config, env, pg, backend, fault, recovery, prepared);
  return trainer.run();
}

}  // namespace dlaunch::train
