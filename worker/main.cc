// dtrain: the bundled distributed ResNet trainer. Run under dlaunch (it reads the torchrun
// worker contract) or alone as a world of one. See docs/dtrain.md.
//
// Exit codes: 0 done, 2 bad usage (flags, a missing --data_dir, a checkpoint from another model
// or run), 1 any other failure (a diverged run among them: inf/NaN loss or weights) (the reason is also written to TORCHELASTIC_ERROR_FILE for the
// agent). Stopped by SIGUSR1 or SIGTERM after writing a checkpoint: 0 under a launcher (dlaunch
// decides: 75 after SIGUSR1, preempted), else 75 (EX_TEMPFAIL: requeue) after SIGUSR1 and
// 128 + 15 after SIGTERM.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <optional>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "common/rank_recovery.h"
#include "common/version.h"
#include "common/worker_env.h"
#include "kernels/backend.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/data/dataset.h"
#include "worker/train/bootstrap.h"
#include "worker/train/device_select.h"
#include "worker/train/op_profile.h"
#include "worker/comm/reformable_process_group.h"
#include "worker/train/peer_state.h"
#include "worker/train/prepared_start.h"
#include "worker/train/rank_recovery.h"
#include "worker/train/startup_phases.h"
#include "worker/train/stop_signal.h"
#include "worker/train/train_config.h"
#include "worker/train/trainer.h"
#include "worker/train/worker_runtime.h"

namespace {

const char* error_type(const std::exception& e) {
  using namespace dlaunch;
  if (dynamic_cast<const UsageError*>(&e)) return "UsageError";
  if (dynamic_cast<const TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const ConnectionError*>(&e)) return "ConnectionError";
  if (dynamic_cast<const ckpt::CheckpointError*>(&e)) return "CheckpointError";
  if (dynamic_cast<const data::DataError*>(&e)) return "DataError";
  if (dynamic_cast<const train::DivergedError*>(&e)) return "DivergedError";
  if (dynamic_cast<const train::PeerStateError*>(&e)) return "PeerStateError";
  if (dynamic_cast<const Error*>(&e)) return "Error";
  return "RuntimeError";
}

// Rank 0's last line: what the run did, or how to continue one a signal stopped.
void log_summary(const dlaunch::train::TrainSummary& summary) {
  using namespace dlaunch;
  std::string partial = summary.partial_epoch > 0
                            ? fmt::format(" and {} of {} steps of epoch {}",
                                          summary.partial_epoch_steps, summary.partial_epoch_of,
                                          summary.partial_epoch)
                            : std::string();
  std::string accuracy = std::isnan(summary.test_accuracy)
                             ? std::string("no test accuracy (no evaluation ran)")
                             : fmt::format("test accuracy {:.2f}%", 100 * summary.test_accuracy);
  if (summary.stop_signal != 0) {
    log_warning("stopped by {}: {} epochs{}, {} steps; checkpoint {}; run again with "
                "--resume auto (the default) to continue from that step",
                train::stop_signal_name(summary.stop_signal), summary.epochs_done, partial,
                summary.steps, summary.stop_checkpoint);
  } else {
    log_info("done: {} epochs{}, {} steps, {}", summary.epochs_done, partial, summary.steps,
             accuracy);
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dlaunch;
  train::mark_startup_begin();
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--version") {
      std::fputs(version_text("dtrain").c_str(), stdout);
      return 0;
    }
  }
  // Before any thread starts: every thread inherits the blocked mask (stop_signal.h).
  train::install_stop_signals();
  // A peer that died closes its sockets: gloo must get EPIPE and throw a message naming the
  // peer, not kill the process with SIGPIPE (a report saying only "signal SIGPIPE").
  std::signal(SIGPIPE, SIG_IGN);
  std::string error_file = get_env_or(env_names::kErrorFile, "");
  try {
    WorkerEnv env = WorkerEnv::from_environ();
    error_file = env.error_file.empty() ? error_file : env.error_file;
    set_log_tag(fmt::format("dtrain rank {}", env.rank));
    train::log_startup_phase(env.replacement ? "main() of a replacement" : "main()");
    bool help = false;
    train::TrainConfig config =
        train::parse_train_args(std::vector<std::string>(argv + 1, argv + argc), &help);
    if (help) {
      std::fputs(train::train_usage().c_str(), stdout);
      return 0;
    }
    if (env.rank == 0 && config.recipe != "none") log_info("{}", train::describe_recipe(config));
    train::check_data_dir(config);
    config.limit_train_samples = get_env_int("DTRAIN_LIMIT_TRAIN_SAMPLES").value_or(0);
    config.limit_test_samples = get_env_int("DTRAIN_LIMIT_TEST_SAMPLES").value_or(0);
    config.stop_check_every = get_env_int("DTRAIN_STOP_CHECK_EVERY").value_or(1);
    if (config.stop_check_every < 1) {
      throw UsageError(fmt::format("DTRAIN_STOP_CHECK_EVERY={} is below 1; expected a number of "
                                   "steps >= 1",
                                   config.stop_check_every));
    }
    kernels::set_host_threads(train::resolve_threads(config.threads, env));
    // Before joining the group: a missing GPU is a usage error of this worker alone (exit 2),
    // said before any peer waits on it.
    const kernels::OpenedDevice device = train::select_device(config, env);
    train::log_startup_phase("device opened");
    train::OpProfile op_profile(*device.backend);  // DTRAIN_PROFILE_OPS (benchmarks only)
    train::FaultInjection fault;
    if (env.restart_count == 0) {
      fault.points = train::parse_fault_points(get_env_or("DTRAIN_FAIL_AT_STEP", ""),
                                               get_env_or("DTRAIN_FAIL_RANK", ""),
                                               env.world_size - 1);
      if (get_env("DTRAIN_FAIL_SIGNAL").value_or("KILL") == "STOP") fault.signal = SIGSTOP;
      fault.after_optimizer = get_env("DTRAIN_FAIL_POINT").value_or("") == "after_optimizer";
      if (!env.replacement) {
        fault.stall_in_reform_rank = get_env_int("DTRAIN_STALL_IN_REFORM").value_or(-1);
      }
    }
    const auto collective_timeout = std::chrono::milliseconds(
        static_cast<int64_t>(std::ceil(config.collective_timeout * 1000)));
    // Joining waits for ranks that start late (a slow node), whatever the collectives' limit.
    const auto join_timeout = std::max<std::chrono::milliseconds>(collective_timeout, std::chrono::seconds(300));
    // A replacement of a failed rank joins the generation its survivors re-form at (the agent
    // bumped the counter before spawning it); every other worker starts at generation 0.
    const std::string recovery_key = train::recovery_key_from_env();
    const train::ConnectStore connect = [&] { return train::connect_job_store(env, join_timeout); };
    // A shrink re-forms this worker as another rank of a smaller world (rank_recovery.h).
    const train::JoinGroup join = [&](int64_t g, int rank, int world,
                                      std::shared_ptr<Store> client) {
      WorkerEnv seat = env;
      seat.rank = rank;
      seat.world_size = world;
      return train::join_process_group(seat, join_timeout, collective_timeout, device, g,
                                       std::move(client));
    };
    std::shared_ptr<Store> store;  // the generation counter's
    int64_t generation = 0;
    std::unique_ptr<comm::ProcessGroup> first;
    const bool recovering = !recovery_key.empty() && config.rank_recovery && env.world_size > 1;
    // A replacement's survivors wait for it: its data, model and kernels are made ready while it
    // joins (prepared_start.h); the model only on the CPU (a GPU's belongs to this thread).
    std::optional<train::StartPreparation> preparing;
    if (recovering && env.replacement) {
      preparing.emplace(config, env, op_profile.backend(), device.cuda_device < 0);
    }
    if (recovering) {
      store = connect();
      train::log_startup_phase("connected to the store");
      if (env.replacement) {
        first = train::join_latest_generation(*store, recovery_key, static_cast<int>(env.rank),
                                              static_cast<int>(env.world_size), connect, join,
                                              &generation);
      }
    }
    if (!first) {
      first = join(generation, static_cast<int>(env.rank), static_cast<int>(env.world_size),
                   nullptr);
    }
    train::log_startup_phase(fmt::format("joined the group (generation {})", generation));
    if (preparing) preparing->joined();
    comm::ReformableProcessGroup pg(std::move(first));
    std::unique_ptr<train::RankRecovery> recovery;
    const std::string recovery_off = train::rank_recovery_off_reason(config, env, pg.backend());
    if (recovery_off.empty()) {
      // The watch's client gives up within seconds: its thread is waited for at the exit.
      const train::ConnectStore watch_connect = [&] {
        return train::connect_job_store(env, std::chrono::seconds(10));
      };
      recovery = std::make_unique<train::RankRecovery>(recovery_key, store, pg, connect, join,
                                                       join_timeout, collective_timeout,
                                                       generation, watch_connect);
      if (env.rank == 0) log_info("rank-level recovery on: a peer's death is survived in process");
    } else if (env.rank == 0 && env.world_size > 1) {
      log_debug("rank-level recovery off: {}", recovery_off);
    }
    std::optional<train::PreparedStart> prepared;
    if (preparing) prepared = preparing->take();
    train::TrainSummary summary =
        train::run_training(config, env, pg, op_profile.backend(), fault, recovery.get(),
                            prepared ? &*prepared : nullptr);
    op_profile.write(env.rank);
    if (pg.rank() == 0) log_summary(summary);  // a shrink may have moved rank 0
    if (summary.stop_signal != 0 && !WorkerEnv::launched()) {
      return summary.stop_signal == SIGUSR1 ? 75 : 128 + summary.stop_signal;
    }
    return 0;
  } catch (const UsageError& e) {
    log_error("{}", e.what());
    train::write_error_file(error_file, error_type(e), e.what());
    withdraw_rank_recovery();
    return 2;
  } catch (const std::exception& e) {
    log_error("{}: {}", error_type(e), e.what());
    train::write_error_file(error_file, error_type(e), e.what());
    withdraw_rank_recovery();  // an error exit is a whole-group restart (rank_recovery.h)
    return 1;
  }
}
