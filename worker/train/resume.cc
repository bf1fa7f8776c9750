#include "worker/train/resume.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "common/error.h"
#include "common/log.h"
#include "worker/checkpoint/flash_checkpoint.h"
#include "worker/metrics/tensorboard_log.h"
#include "worker/train/checkpoint_meta.h"
#include "worker/train/peer_state.h"

namespace dlaunch::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

double ms_since(Clock::time_point t) {
  return 1e3 * std::chrono::duration<double>(Clock::now() - t).count();
}

// "20261123T110600Z-9f...: 3 files, newest .../checkpoint_epoch_0007.dtck" per run (files
// without an id, or corrupt, grouped as such), for messages about an --output_dir holding
// checkpoints of other runs.
std::string describe_runs(const std::vector<ckpt::CheckpointFile>& files) {
  std::vector<std::string> order;
  std::map<std::string, std::pair<int, std::string>> runs;  // id -> count, newest
  for (const auto& f : files) {
    const std::string id =
        f.valid ? (f.run_id().empty() ? "(no run id)" : f.run_id()) : "(corrupt)";
    auto [it, fresh] = runs.try_emplace(id, 0, f.path);
    if (fresh) order.push_back(id);
    ++it->second.first;
  }
  std::string out;
  for (const auto& id : order) {
    const auto& [n, newest] = runs[id];
    out += fmt::format("{}{}: {} file{}, newest {}", out.empty() ? "" : "; ", id, n,
                       n == 1 ? "" : "s", newest);
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

// Whether a resume carries the checkpoint's EMA: it has one and this run keeps one.
bool resumes_ema(const TrainConfig& config, const json& meta) {
  return config.ema > 0 && meta.contains("ema");
}

void overwrite_output_dir(const std::string& output_dir) {
  int removed = 0;
  for (const std::string& path : ckpt::list_checkpoints(output_dir)) {
    std::error_code ec;
    fs::remove(path, ec);
    if (ec) {
      throw SystemError(fmt::format("--overwrite: cannot delete {}: {}", path, ec.message()));
    }
    ++removed;
  }
  for (const char* name : {"metrics.jsonl", "curves.svg"}) {
    std::error_code ec;
    if (fs::remove(fs::path(output_dir) / name, ec)) ++removed;
  }
  removed += metrics::remove_event_files(output_dir);
  if (removed > 0) {
    log_warning(
        "--overwrite: deleted {} file(s) of earlier runs from {} (checkpoints, "
        "metrics.jsonl, curves.svg, TensorBoard event files)",
        removed, output_dir);
  }
}

// Rank 0: the disk checkpoint to resume from (nullopt: a fresh start), after clearing leftovers.
std::optional<ckpt::LoadedCheckpoint> choose_disk_checkpoint(const TrainConfig& config) {
  for (const std::string& path : ckpt::remove_stale_temporaries(config.output_dir)) {
    log_info("removed {}, left by a checkpoint write that was interrupted", path);
  }
  if (config.overwrite) {
    overwrite_output_dir(config.output_dir);
    return std::nullopt;
  }
  const std::vector<ckpt::CheckpointFile> files = ckpt::scan_checkpoints(config.output_dir);
  const std::string path = checkpoint_to_resume(config.resume, config.output_dir, files);
  if (path.empty()) return std::nullopt;
  ckpt::LoadedCheckpoint loaded{path, ckpt::read_checkpoint(path)};
  if (config.resume != "auto") {
    require_one_run(path, loaded.ckpt.meta.value("run_id", std::string()), config.output_dir,
                    files);
  }
  return loaded;
}

// Rank 0: the disk checkpoint, or the flash copy a restarted worker of this job finds its
// predecessor left when that is newer (--flash_every).
std::optional<ckpt::LoadedCheckpoint> choose_checkpoint(const TrainConfig& config,
                                                        const std::string& flash_dir) {
  std::optional<ckpt::LoadedCheckpoint> disk = choose_disk_checkpoint(config);
  if (config.resume != "auto" || config.overwrite || flash_dir.empty()) return disk;
  return ckpt::newest_with_flash(std::move(disk), flash_dir);
}

// Rank 0: refuses a checkpoint this run cannot continue (other settings, missing arrays).
void check_resumable(const ckpt::LoadedCheckpoint& loaded, const TrainConfig& config,
                     const data::ImageDataset& train_set, model::ResNet& model) {
  std::string differ = incompatible_settings(loaded.ckpt.meta, config,
                                             model_signature(config, train_set, model.config()));
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
  std::vector<std::pair<std::string, size_t>> expected{{"params", model.num_params()}};
  const auto names = model.buffer_names();
  const auto buffers = model.buffers();
  for (size_t i = 0; i < buffers.size(); ++i) {
    expected.emplace_back("buffer." + names[i], static_cast<size_t>(buffers[i]->numel()));
  }
  if (resumes_ema(config, loaded.ckpt.meta)) {
    size_t n = model.num_params();
    for (const Tensor* b : buffers) n += static_cast<size_t>(b->numel());
    expected.emplace_back("ema", n);
  }
  ckpt::require_arrays(loaded.ckpt, loaded.path, expected);
}

// Rank 0: chooses, checks and reads the checkpoint into `checkpoint`, and settles the run's id.
// Returns the decision every rank receives: {"resume": path, "meta": ..., "run_id": id},
// {"run_id": id} for a fresh start, or {"error": message, "kind": "usage" | "checkpoint"}.
json decide(const TrainConfig& config, const data::ImageDataset& train_set, model::ResNet& model,
            const std::string& flash_dir, ckpt::Checkpoint& checkpoint, std::string& run_id) {
  json decision = json::object();
  try {
    std::optional<ckpt::LoadedCheckpoint> loaded = choose_checkpoint(config, flash_dir);
    if (loaded) {
      check_resumable(*loaded, config, train_set, model);
      decision = {{"resume", loaded->path}, {"meta", loaded->ckpt.meta}};
      run_id = loaded->ckpt.meta.value("run_id", std::string());
      checkpoint = std::move(loaded->ckpt);
    }
    if (run_id.empty()) {
      run_id = ckpt::new_run_id();
      log_info("run id {} (recorded in every checkpoint of this run)", run_id);
    }
    decision["run_id"] = run_id;
  } catch (const UsageError& e) {
    decision = {{"error", e.what()}, {"kind", "usage"}};
  } catch (const Error& e) {
    decision = {{"error", e.what()}, {"kind", "checkpoint"}};
  }
  return decision;
}

// The checkpoint's arrays as one vector, in the order apply_state() takes them: parameters,
// buffers (BN running statistics), the EMA when this run takes it, the optimizer's state. Present
// and sized: check_resumable.
std::vector<float> flatten_state(const TrainConfig& config, model::ResNet& model,
                                 const ckpt::Checkpoint& checkpoint) {
  const auto names = model.buffer_names();
  const size_t n_buffers = model.buffers().size();
  std::vector<float> all = *checkpoint.find("params");
  for (size_t i = 0; i < n_buffers; ++i) {
    const std::vector<float>& v = *checkpoint.find("buffer." + names[i]);
    all.insert(all.end(), v.begin(), v.end());
  }
  if (resumes_ema(config, checkpoint.meta)) {
    all.insert(all.end(), checkpoint.find("ema")->begin(), checkpoint.find("ema")->end());
  }
  const std::vector<float>& opt = *checkpoint.find("optimizer.state");
  all.insert(all.end(), opt.begin(), opt.end());
  return all;
}

// The model's parameters and buffers, the optimizer's state and fp16's loss scale from `all`
// (flatten_state's) and `meta`. Returns the EMA when this run takes it (else empty). The loss
// scale first: it is the one part that can refuse (a malformed entry), and a refusal must leave
// the rest untouched.
std::vector<float> apply_state(const TrainConfig& config, const ResumeTargets& targets,
                               const std::vector<float>& all, const json& meta) {
  // fp16's loss scale goes on where it was (a checkpoint without one starts afresh).
  targets.precision.load_state_json(meta.value("grad_scaler", json()));
  model::ResNet& model = targets.model;
  size_t at = 0;
  auto take = [&](size_t n) {
    DL_CHECK(at + n <= all.size()) << at << " + " << n << " > " << all.size();
    const float* p = all.data() + at;
    at += n;
    return p;
  };
  model.params_tensor().copy_from_host(take(model.num_params()));
  size_t buffer_floats = 0;
  for (auto* b : model.buffers()) {
    b->copy_from_host(take(static_cast<size_t>(b->numel())));
    buffer_floats += static_cast<size_t>(b->numel());
  }
  std::vector<float> ema;
  if (resumes_ema(config, meta)) {
    const size_t n = model.num_params() + buffer_floats;
    const float* p = take(n);
    ema.assign(p, p + n);
  }
  std::vector<float> state(all.begin() + static_cast<std::ptrdiff_t>(at), all.end());
  targets.optimizer.load_state(std::move(state), meta.value("optimizer_steps", int64_t{0}));
  return ema;
}

// Every rank: the state from rank 0's `checkpoint` (empty on the other ranks). One broadcast for
// all of it: one per BN buffer would cost a round trip each, on the path of every restarted
// worker.
std::vector<float> load_resumed_state(const TrainConfig& config, comm::ProcessGroup& pg,
                                      const ResumeTargets& targets,
                                      const ckpt::Checkpoint& checkpoint, const json& meta) {
  std::vector<float> all;
  if (pg.rank() == 0) all = flatten_state(config, targets.model, checkpoint);
  broadcast_floats(pg, all);
  return apply_state(config, targets, all, meta);
}

// Rank 0: where the resumed run goes on, in the log.
void log_position(const ResumePoint& point, int world_size, int64_t batch_size,
                  int64_t train_size) {
  const EpochResume& inside = point.inside_epoch;
  if (inside.seen > 0) {
    log_info(
        "the checkpoint stopped inside epoch {} with {} worker(s) of batch {}; now {} "
        "of batch {}: the epoch goes on with the {} of its {} samples not trained yet",
        point.epochs_done + 1, point.saved_world_size, point.saved_batch_size, world_size,
        batch_size, train_size - inside.seen, train_size);
  }
  log_info("resumed from {}: {} epochs and {} steps done{} (saved by a world of {}, now {})",
           point.checkpoint, point.epochs_done, point.global_step,
           inside.skip_steps > 0 ? fmt::format(", continuing epoch {} after its step {}",
                                               point.epochs_done + 1, inside.skip_steps)
                                 : std::string(),
           point.saved_world_size, world_size);
}

}  // namespace

ResumePoint resume_point_of(const json& meta, int64_t world_size, int64_t batch_size,
                            int64_t train_size) {
  ResumePoint point;
  point.epochs_done = meta.value("epoch", int64_t{0});
  point.global_step = meta.value("step", int64_t{0});
  point.test_loss = meta.value("test_loss", std::nan(""));
  point.test_accuracy = meta.value("test_accuracy", std::nan(""));
  point.saved_world_size = meta.value("world_size", int64_t{0});
  point.saved_batch_size = meta.value("batch_size", int64_t{0});
  point.saved_global_batch = meta.value("global_batch", int64_t{0});
  const int64_t epoch_step = meta.value("epoch_step", int64_t{0});
  if (epoch_step <= 0) return point;
  EpochResume& inside = point.inside_epoch;
  inside.totals = EpochTotals::from_json(meta.value("epoch_totals", json::array({0, 0, 0})));
  // The steps done inside the epoch index the shards of the world and batch size that did them:
  // the same world skips as many of its batches; another one (or an epoch that began after such
  // a change) goes on with the samples of the permutation not trained yet.
  const int64_t seen_before = meta.value("epoch_seen_before", int64_t{0});
  if (seen_before == 0 && point.saved_world_size == world_size &&
      point.saved_batch_size == batch_size) {
    inside.skip_steps = epoch_step;
    return point;
  }
  // The ranks that trained took a prefix of the epoch's permutation (padding aside): the rest
  // is shared among this world (distributed_sampler.h), no sample twice.
  inside.seen = std::min<int64_t>(
      seen_before + epoch_step * point.saved_batch_size * point.saved_world_size, train_size - 1);
  return point;
}

std::string checkpoint_to_resume(const std::string& resume, const std::string& output_dir,
                                 const std::vector<ckpt::CheckpointFile>& files) {
  if (resume == "none") {
    if (files.empty()) return "";
    // Pruning and --resume auto go by the numbers in the names: a new run among an earlier
    // run's checkpoints would have its own deleted, or be mistaken for the other.
    throw UsageError(fmt::format(
        "--resume none starts a new run, but --output_dir {} holds {} checkpoint(s) of an "
        "earlier run ({}); continue that run with --resume auto, delete them and start over "
        "with --overwrite, or pass another --output_dir",
        output_dir, files.size(), describe_runs(files)));
  }
  std::vector<const ckpt::CheckpointFile*> valid;
  for (const auto& f : files) {
    if (f.valid) {
      valid.push_back(&f);
    } else {
      log_warning("skipping checkpoint {}: {}", f.path, f.error);
    }
  }
  if (resume != "auto") return resume;
  if (files.empty()) return "";
  if (valid.empty()) {
    std::string why;
    for (const auto& f : files) why += fmt::format("\n  {}: {}", f.path, f.error);
    throw ckpt::CheckpointError(fmt::format(
        "--output_dir {} holds {} checkpoint(s) but none is valid, so there is nothing to "
        "resume; dtrain will not start over on top of them. Move them away, pass --overwrite to "
        "delete them and start a new run, or --resume PATH to load a good copy:{}",
        output_dir, files.size(), why));
  }
  // Files without a run id predate run ids; the run that resumed from one carries on under a
  // new id, so they count as nobody's (never pruned, never a second run).
  std::set<std::string> runs;
  for (const auto* f : valid) {
    if (!f->run_id().empty()) runs.insert(f->run_id());
  }
  if (runs.size() > 1) {
    throw UsageError(fmt::format(
        "--output_dir {} holds checkpoints of {} runs ({}); dtrain cannot tell which one to "
        "continue: pass --resume PATH, --overwrite to start a new run, or another --output_dir",
        output_dir, runs.size(), describe_runs(files)));
  }
  return valid.front()->path;
}

void require_one_run(const std::string& path, const std::string& run_id,
                     const std::string& output_dir,
                     const std::vector<ckpt::CheckpointFile>& files) {
  for (const auto& f : files) {
    if (!f.valid || f.run_id() == run_id) continue;
    throw UsageError(fmt::format(
        "--resume {} continues run {}, but --output_dir {} holds checkpoints of another run "
        "({}): the two would prune each other's files; pass another --output_dir",
        path, run_id.empty() ? "(no run id)" : run_id, output_dir, describe_runs(files)));
  }
}

namespace {

// What a rank takes from a live peer's state: loaded into the targets, then its position.
struct PeerLoad {
  json meta;
  std::vector<float> ema;
  std::string from;

  // Decoded and checked in full before anything is copied: a refusal leaves this rank as it was.
  LoadState loader(const TrainConfig& config, const data::ImageDataset& train_set,
                   const ResumeTargets& targets) {
    return [this, &config, &train_set, targets](const std::vector<uint8_t>& bytes, int source) {
      from = fmt::format("the training state of rank {} (a live peer)", source);
      ckpt::LoadedCheckpoint loaded{from, ckpt::decode_checkpoint(bytes, from)};
      check_resumable(loaded, config, train_set, targets.model);
      const std::vector<float> all = flatten_state(config, targets.model, loaded.ckpt);
      ema = apply_state(config, targets, all, loaded.ckpt.meta);
      meta = std::move(loaded.ckpt.meta);
    };
  }

  ResumePoint point(const TrainConfig& config, int world_size, int64_t train_size) {
    ResumePoint p = resume_point_of(meta, world_size, config.batch_size, train_size);
    // A live peer's epoch goes on in the same world with the peers' batch (the trainer takes
    // it: not --batch_size after a shrink with --elastic_batch global), sharded as it began: an
    // epoch that began after a re-form at another world size (seen_before > 0) skips its steps
    // done within that sharding, exactly as the peers that sent the state go on (the checkpoint
    // rule would re-shard the rest, with other batches).
    const int64_t seen_before = meta.value("epoch_seen_before", int64_t{0});
    const int64_t epoch_step = meta.value("epoch_step", int64_t{0});
    if (epoch_step > 0 && p.saved_world_size == world_size) {
      p.inside_epoch.seen = seen_before;
      p.inside_epoch.skip_steps = epoch_step;
    }
    p.resumed = true;
    p.checkpoint = from;
    p.run_id = meta.value("run_id", std::string());
    p.ema = std::move(ema);
    return p;
  }
};

}  // namespace

PeerStateResult exchange_state_as_survivor(const TrainConfig& config, comm::ProcessGroup& pg,
                                           const data::ImageDataset& train_set,
                                           const ResumeTargets& targets, int64_t version,
                                           const SerializeState& serialize,
                                           std::optional<ResumePoint>* received) {
  PeerLoad peer;
  const PeerStateResult result =
      share_newest_state(pg, version, serialize, peer.loader(config, train_set, targets));
  if (result.loaded) *received = peer.point(config, pg.size(), train_set.size());
  return result;
}

std::optional<ResumePoint> resume_from_peer(const TrainConfig& config, comm::ProcessGroup& pg,
                                            const data::ImageDataset& train_set,
                                            const ResumeTargets& targets) {
  PeerLoad peer;
  const PeerStateResult result =
      share_newest_state(pg, kNoState, {}, peer.loader(config, train_set, targets));
  if (result.outcome == PeerStateOutcome::kNoSurvivor) {
    if (pg.rank() == 0) {
      log_info(
          "no rank of this group holds the training state (every rank is new): resuming from "
          "the flash copy or the disk checkpoint");
    }
    return std::nullopt;
  }
  // Holding no state, this rank either received it or the exchange failed.
  if (result.outcome != PeerStateOutcome::kReceived) {
    throw PeerStateError(fmt::format(
        "this replacement rank could not take the training state from a live peer: {}. The "
        "worker exits so that the job restarts from the flash copy or the disk checkpoint",
        result.error));
  }
  ResumePoint point = peer.point(config, pg.size(), train_set.size());
  if (pg.rank() == 0) log_position(point, pg.size(), config.batch_size, train_set.size());
  return point;
}

// Rank 0 decides and reads; the others learn the outcome by broadcast. The phases of a
// restarted worker's resume are timed at debug level: they are on the path from a worker's
// death to the next step (docs/benchmarks.md, "Flash checkpoints").
ResumePoint resume(const TrainConfig& config, comm::ProcessGroup& pg,
                   const data::ImageDataset& train_set, const ResumeTargets& targets,
                   const std::string& flash_dir, bool replacement) {
  if (replacement) {
    if (std::optional<ResumePoint> point = resume_from_peer(config, pg, train_set, targets)) {
      return std::move(*point);
    }
  }
  const bool rank0 = pg.rank() == 0;
  const Clock::time_point t0 = Clock::now();
  ckpt::Checkpoint checkpoint;
  std::string run_id;
  json decision = json::object();
  if (rank0) {
    decision = decide(config, train_set, targets.model, flash_dir, checkpoint, run_id);
    log_debug("resume: chose and read the state in {:.0f} ms", ms_since(t0));
  }
  decision = json::parse(broadcast_string(pg, decision.dump()));
  const Clock::time_point t_decided = Clock::now();
  if (decision.contains("error")) {
    std::string msg = decision["error"];
    if (decision["kind"] == "usage") throw UsageError(msg);
    throw ckpt::CheckpointError(msg);
  }
  // Every rank knows the run: each node's local rank 0 writes it into its flash copies, and any
  // rank may be the one a replacement takes the state from.
  run_id = decision.value("run_id", std::string());
  if (!decision.contains("resume")) {
    targets.data_parallel.broadcast_state();
    ResumePoint fresh;
    fresh.run_id = run_id;
    return fresh;
  }
  const json& meta = decision["meta"];
  std::vector<float> ema = load_resumed_state(config, pg, targets, checkpoint, meta);
  log_debug("resume: decision agreed {:.0f} ms after this rank began; state broadcast in {:.0f} ms",
            1e3 * std::chrono::duration<double>(t_decided - t0).count(), ms_since(t_decided));
  ResumePoint point = resume_point_of(meta, pg.size(), config.batch_size, train_set.size());
  point.resumed = true;
  point.checkpoint = decision["resume"];
  point.run_id = run_id;
  point.ema = std::move(ema);
  if (rank0) log_position(point, pg.size(), config.batch_size, train_set.size());
  return point;
}

}  // namespace dlaunch::train
