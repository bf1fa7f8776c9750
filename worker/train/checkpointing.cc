#include "worker/train/checkpointing.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "common/log.h"
#include "worker/train/checkpoint_meta.h"

namespace dlaunch::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {
constexpr size_t kCheckpointsKept = 3;
}  // namespace

ckpt::Checkpoint build_checkpoint(const TrainConfig& config, const std::string& run_id,
                                  int world_size, const TrainingState& state,
                                  const CheckpointPosition& at) {
  ckpt::Checkpoint checkpoint;
  nlohmann::json& meta = checkpoint.meta;
  meta = {{"format", "dtrain"},
          {"run_id", run_id},
          {"epoch", at.epochs_done},
          {"step", state.global_step},
          {"optimizer_steps", state.optimizer.step_count()},
          {"world_size", world_size},
          {"batch_size", state.batch_size > 0 ? state.batch_size : config.batch_size},
          {"signature", model_signature(config, state.train_set, state.model.config())},
          {"config", config_json(config)},
          // The sampler and augmentation are pure functions of (seed, epoch, index): the next
          // epoch and the seed are their whole state, whatever the world size; inside an epoch,
          // the steps done (with this world and batch size) say where to go on.
          {"sampler", {{"seed", config.seed}, {"next_epoch", at.epochs_done}, {"shuffle", true}}},
          {"rng", {{"seed", config.seed}, {"kind", "splitmix64 counter-based"}}}};
  if (state.global_batch > 0) meta["global_batch"] = state.global_batch;
  if (at.epoch_step > 0) {
    meta["epoch_step"] = at.epoch_step;
    // The epoch began here after a prefix trained by another world: epoch_step counts from there.
    if (at.seen_before > 0) meta["epoch_seen_before"] = at.seen_before;
    meta["epoch_totals"] = at.totals.to_json();
  }
  // The last evaluation, so a run that resumes with nothing left to train can still report it.
  if (!std::isnan(state.test_accuracy)) {
    meta["test_loss"] = state.test_loss;
    meta["test_accuracy"] = state.test_accuracy;
  }
  // Host copies: the same file whatever the device (a GPU run resumes on the CPU and back).
  checkpoint.add("params", state.model.params_tensor().to_host());
  auto names = state.model.buffer_names();
  auto buffers = state.model.buffers();
  for (size_t i = 0; i < buffers.size(); ++i) {
    checkpoint.add("buffer." + names[i], buffers[i]->to_host());
  }
  checkpoint.add("optimizer.state", state.optimizer.state());
  if (state.ema) {
    checkpoint.add("ema", state.ema->state());
    meta["ema"] = {{"decay", state.ema->decay()},
                   {"every", state.ema->every()},
                   {"warmup", state.ema->warmup()}};
  }
  if (state.precision.loss_scaling()) meta["grad_scaler"] = state.precision.state_json();
  return checkpoint;
}

std::vector<uint8_t> encode_training_state(const TrainConfig& config, const std::string& run_id,
                                           int world_size, const TrainingState& state,
                                           const CheckpointPosition& at) {
  return ckpt::encode_checkpoint(build_checkpoint(config, run_id, world_size, state, at));
}

Checkpointer::Checkpointer(const TrainConfig& config, comm::ProcessGroup& pg)
    : config_(config), pg_(pg) {}

void Checkpointer::open_flash(const WorkerEnv& env) {
  if (config_.flash_every <= 0 || env.local_rank != 0 || env.flash_dir.empty()) return;
  try {
    const std::string persist_to =
        config_.output_dir.empty() ? "" : fs::absolute(config_.output_dir).string();
    flash_ = std::make_unique<ckpt::FlashWriter>(env.flash_dir, persist_to);
  } catch (const SystemError& e) {
    log_warning("no flash copies: {}", e.what());
  }
}

std::string Checkpointer::flash_dir() const {
  return flash_ ? flash_->dir() : std::string();
}

std::string Checkpointer::save(const TrainingState& state, const CheckpointPosition& at) {
  if (pg_.rank() != 0) return "";
  const std::string name =
      at.epoch_step > 0 ? ckpt::partial_checkpoint_file_name(at.epochs_done, state.global_step)
                        : ckpt::checkpoint_file_name(at.epochs_done);
  std::string path = (fs::path(config_.output_dir) / name).string();
  // Encoded once: the flash copy now, the disk file from the same bytes on the persister's
  // thread (fsync and pruning off the training thread).
  auto bytes = std::make_shared<const std::vector<uint8_t>>(
      encode_training_state(config_, run_id_, pg_.size(), state, at));
  if (flash_) write_flash(name, *bytes, state.global_step);
  persister_.submit(bytes, path, [dir = config_.output_dir, run = run_id_] {
    ckpt::prune_checkpoints(dir, kCheckpointsKept, run);
  });
  return path;
}

void Checkpointer::save_flash(const TrainingState& state, const CheckpointPosition& at) {
  if (!flash_) return;
  const auto t0 = Clock::now();
  write_flash(ckpt::partial_checkpoint_file_name(at.epochs_done, state.global_step),
              encode_training_state(config_, run_id_, pg_.size(), state, at), state.global_step);
  flash_secs_ += std::chrono::duration<double>(Clock::now() - t0).count();
  ++flash_writes_;
}

void Checkpointer::write_flash(const std::string& name, const std::vector<uint8_t>& bytes,
                               int64_t global_step) {
  try {
    flash_->write(name, bytes);
  } catch (const SystemError& e) {
    log_warning(
        "flash copies are off from step {} on: {} (raise dlaunch's --flash_limit; disk "
        "checkpoints go on)",
        global_step, e.what());
    flash_.reset();
  }
}

void Checkpointer::log_flash_costs() const {
  if (pg_.rank() != 0 || flash_writes_ == 0) return;
  log_info("flash copies: {} mid-epoch writes{}, {:.2f} ms each on average", flash_writes_,
           flash_ ? " to " + flash_->dir() : std::string(" (turned off on the way)"),
           1e3 * flash_secs_ / static_cast<double>(flash_writes_));
}

}  // namespace dlaunch::train
