#include "launcher/agent/agent_workers.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "launcher/agent/failure_report.h"
#include "launcher/agent/rank_replacement.h"
#include "launcher/hang/heartbeat_file.h"
#include "launcher/output/line_splitter.h"
#include "launcher/config/python_hooks.h"
#include "launcher/config/torchrun_flags.h"

namespace dlaunch {

WorkerSupervisor::WorkerSupervisor(AgentContext& agent)
    : agent_(agent),
      console_is_terminal_(::isatty(STDOUT_FILENO) == 1),
      partial_lines_(agent.io, *agent.opts.clock),
      store_proxy_(agent.opts.store_proxy, agent.opts.job_token) {}

void WorkerSupervisor::prepare() { omp_threads_ = default_omp_threads(agent_.cfg, agent_.opts); }

void WorkerSupervisor::start() {
  // A copy (a nested restart replaces the round), in the workers' view: the store's address is
  // the node's proxy's, when on.
  const RendezvousResult r = store_proxy_.route(*agent_.last_round);
  const WorkerPlacement place = place_workers(r, agent_.cfg.nproc_per_node);
  auto records = agent_.files.make_attempt(agent_.state().generation, place.first_rank,
                                          agent_.cfg.nproc_per_node);
  if (!records) {
    agent_.post({Event::Kind::kAttemptFailed});
    return;
  }
  agent_.group = std::make_unique<WorkerGroup>(agent_.state().generation, std::move(*records));
  outputs_.assign(static_cast<size_t>(agent_.cfg.nproc_per_node), nullptr);
  // The agent reaches the store as it is, not through this node's proxy.
  if (agent_.state().rank_recovery) {
    agent_.recovery.begin(recovery_key(agent_.cfg.run_id, r.restart_count),
                          agent_.last_round->master_addr, agent_.last_round->master_port,
                          agent_.opts.job_token);
  } else {
    agent_.recovery.off();
  }
  round_ = r;
  place_ = place;
  agent_.workers_round = r.round;
  log_info("attempt {}: starting {} worker(s), global ranks {}-{} of {} (node {} of {}), "
           "restart count {}/{}",
           agent_.state().generation, agent_.cfg.nproc_per_node, place.first_rank,
           place.first_rank + agent_.cfg.nproc_per_node - 1, place.world, r.group_rank,
           r.group_world_size, r.restart_count, agent_.cfg.max_restarts);
  agent_.post({Event::Kind::kWorkersStarting});
  auto console = make_shared_console(agent_.cfg);  // --log_fold
  console_ = console;
  filtered_.reset();
  try {
    const std::string& rank_dir = agent_.group->worker(0).log_dir;
    filtered_ = FilteredCopy::open(agent_.cfg, rank_dir.substr(0, rank_dir.rfind('/')));
  } catch (const Error& e) {
    log_warning("{}; --duplicate_*_filters copies nothing in attempt {}", e.what(),
                agent_.state().generation);
  }
  for (int64_t local_rank = 0; local_rank < agent_.cfg.nproc_per_node; ++local_rank) {
    if (!spawn(r, place, local_rank, console)) return;
  }
  agent_.post({Event::Kind::kWorkersSpawned});
}

bool WorkerSupervisor::spawn(const RendezvousResult& r, WorkerPlacement place,
                             int64_t local_rank, const std::shared_ptr<SharedConsole>& console) {
  WorkerRecord& w = agent_.group->worker(local_rank);
  WorkerEnvInputs inputs{&agent_.cfg, &agent_.opts, omp_threads_, console_is_terminal_,
                         agent_.state().generation};
  SpawnRequest req;
  req.argv = agent_.cfg.worker_argv(local_rank);
  WorkerEnv contract = worker_contract(inputs, r, place, local_rank, w.log_dir);
  contract.replacement = w.replacement;
  req.env = full_worker_env(contract, agent_.opts.base_env);
  if (agent_.recovery.on()) set_env(req.env, env_names::kRecoveryKey, agent_.recovery.key());
  if (agent_.cfg.virtual_local_rank) apply_virtual_local_rank(req.env, local_rank);
  // torchrun 2.x's agent exports its --signals_to_handle, and its workers inherit it (a worker
  // that starts processes with torch.distributed.elastic handles the same signals).
  set_env(req.env, "TORCHELASTIC_SIGNALS_TO_HANDLE", agent_.cfg.signals_to_handle);
  const std::string prefix =
      console_prefix(agent_.cfg, local_rank, w.global_rank, agent_.opts.host);
  if (!agent_.cfg.no_python_hooks && !agent_.opts.python_hooks_dir.empty()) {
    add_python_hooks_env(req.env, agent_.opts.python_hooks_dir, w.log_dir + "/py_stack.txt");
  }
  try {
    auto out = std::make_shared<WorkerOutput>(
        agent_.cfg, local_rank, w.log_dir, console,
        [this](std::shared_ptr<const OutputLoss> loss) { on_output_loss(std::move(loss)); },
        prefix, /*append=*/w.replacement);
    outputs_[static_cast<size_t>(local_rank)] = out;
    int pid = agent_.procs.spawn(req, callbacks(local_rank, out, prefix));
    agent_.group->on_started(local_rank, pid, agent_.opts.clock->now(),
                             std::chrono::system_clock::now());
    agent_.monitor->events().emit("worker_started", {{"rank", w.global_rank},
                                                {"local_rank", local_rank},
                                                {"pid", pid},
                                                {"attempt", agent_.state().generation},
                                                {"replacement", w.replacement}});
    log_debug("local rank {} started as pid {}", local_rank, pid);
    return true;
  } catch (const SpawnError& e) {
    log_spawn_error(e.what());
    agent_.group->on_spawn_failed(e.what());
    Event failed{Event::Kind::kSpawnFailed};
    failed.flag = true;  // the program cannot be executed here: no restart helps
    agent_.post(failed);
    return false;
  } catch (const Error& e) {
    log_error("cannot start local rank {}: {}", local_rank, e.what());
    agent_.group->on_spawn_failed(e.what());
  }
  agent_.post({Event::Kind::kSpawnFailed});
  return false;
}

ProcessCallbacks WorkerSupervisor::callbacks(int64_t local_rank,
                                             const std::shared_ptr<WorkerOutput>& out,
                                             const std::string& prefix) {
  const int64_t gen = agent_.state().generation;
  std::shared_ptr<FilteredCopy> filtered = filtered_;
  auto tail = std::make_shared<LineSplitter>();
  auto add_tail = [this, gen, local_rank](std::string_view line) {
    if (gen == agent_.state().generation && agent_.group) {
      agent_.group->add_stderr_line(local_rank, std::string(line));
    }
  };
  ProcessCallbacks cb;
  cb.on_output = [this, out, tail, add_tail, filtered, local_rank, prefix](
                     int stream, std::string_view bytes) {
    out->write(stream, bytes, agent_.opts.clock->now());
    if (filtered) filtered->feed(local_rank, stream, bytes, prefix);
    if (stream == 2) tail->feed(bytes, add_tail);
    if (out->next_due()) partial_lines_.watch(out);
  };
  cb.on_exit = [this, gen, local_rank, out, tail, add_tail, filtered,
                prefix](const ExitStatus& st) {
    out->finish();
    if (filtered) filtered->finish(local_rank, prefix);
    if (out->next_due()) partial_lines_.watch(out);  // lines held by --log_fold
    tail->flush(add_tail);
    on_exit(gen, local_rank, st);
  };
  cb.on_exec_failed = [this, gen, local_rank](const std::string& message) {
    on_exec_failed(gen, local_rank, message);
  };
  return cb;
}

void WorkerSupervisor::on_exit(int64_t gen, int64_t local_rank, const ExitStatus& st) {
  // An abandoned worker of an earlier generation.
  if (gen != agent_.state().generation || !agent_.group) return;
  bool was_final = agent_.group->final();
  if (!was_final && !st.success()) offer_replacement(local_rank, st);
  agent_.group->on_exit(local_rank, st, agent_.opts.clock->now(), std::chrono::system_clock::now());
  const WorkerRecord& w = agent_.group->worker(local_rank);
  agent_.monitor->events().emit("worker_exited",
                           {{"rank", w.global_rank},
                            {"local_rank", local_rank},
                            {"pid", w.pid},
                            st.signaled ? EventFields::value_type{"signal", signal_name(st.code)}
                                        : EventFields::value_type{"exit_code", st.code},
                            {"attempt", agent_.state().generation}});
  if (w.replacing && !agent_.group->final() && agent_.state().phase == AgentPhase::kRunning) {
    respawn(local_rank);
    return;
  }
  if (!was_final && agent_.group->state() == GroupState::kFailed) {
    log_error("local rank {} (rank {}, pid {}) failed: {}; stopping the other workers",
              local_rank, w.global_rank, w.pid, st.describe());
    Event failed{Event::Kind::kWorkerFailed};
    failed.text = fmt::format("rank {} on {} failed: {}", w.global_rank, agent_.opts.host,
                              st.describe());
    agent_.post(failed);
    return;
  }
  log_debug("local rank {} (pid {}) exited: {}", local_rank, w.pid, st.describe());
  Event exited{Event::Kind::kWorkerExited};
  exited.group = agent_.group->state();
  exited.all_exited = agent_.group->all_exited();
  exited.count = agent_.cfg.nproc_per_node;
  agent_.post(exited);
}

void WorkerSupervisor::offer_replacement(int64_t local_rank, const ExitStatus& st) {
  const WorkerRecord& w = agent_.group->worker(local_rank);
  if (!agent_.recovery.on() || agent_.group->state() != GroupState::kHealthy || w.replacing ||
      w.state != WorkerState::kRunning) {
    return;
  }
  Event failed{Event::Kind::kRankFailed};
  failed.count = local_rank;
  failed.flag = announced_rank_recovery(w.heartbeat_file);
  failed.in_flight = replacement_in_flight(*agent_.group, agent_.opts.last_beat);
  failed.text = fmt::format("rank {} (local {}, pid {}) failed: {}", w.global_rank, local_rank,
                            w.pid, st.describe());
  agent_.post(failed);
}

void WorkerSupervisor::respawn(int64_t local_rank) {
  WorkerGroup& group = *agent_.group;
  int64_t generation = 0;
  try {
    generation = agent_.recovery.announce(kReplaceVerdict);
  } catch (const std::exception& e) {
    const WorkerRecord& w = group.worker(local_rank);
    log_error("cannot announce the replacement of local rank {} in the job's store at {}:{} "
              "({}); restarting the worker group instead",
              local_rank, agent_.last_round->master_addr, agent_.last_round->master_port,
              e.what());
    group.replacement_failed(local_rank);
    Event failed{Event::Kind::kWorkerFailed};
    failed.text = fmt::format("rank {} on {} failed: {}", w.global_rank, agent_.opts.host,
                              w.exit ? w.exit->describe() : "replacement not announced");
    agent_.post(failed);
    return;
  }
  {
    const WorkerRecord& old = group.worker(local_rank);
    agent_.earlier_failures.push_back(fmt::format("attempt {}: {} (replaced in process)",
                                                  group.attempt(),
                                                  describe_end(old, agent_.cfg.hang_timeout)));
    // Its error file would be taken for the replacement's if that one failed without writing
    // its own: kept beside it under the replacement's number.
    const std::string kept =
        fmt::format("{}/error.replaced_{}.json", old.log_dir, old.replacements + 1);
    if (::rename(old.error_file.c_str(), kept.c_str()) != 0 && errno != ENOENT) {
      log_warning("cannot keep {} as {}: {}", old.error_file, kept, std::strerror(errno));
    }
  }
  group.restart_worker(local_rank);
  const WorkerRecord& w = group.worker(local_rank);
  // Anew: the replacement is in flight until it beats, and it announces rank_recovery itself.
  if (!arm_heartbeat_file(w.heartbeat_file)) {
    log_warning("cannot reset the heartbeat file {}: {}", w.heartbeat_file, std::strerror(errno));
  }
  log_info("local rank {} (rank {}): starting its replacement (generation {} of {})", local_rank,
           w.global_rank, generation, agent_.recovery.key());
  spawn(*round_, place_, local_rank, console_);
}

void WorkerSupervisor::shrank() {
  round_ = store_proxy_.route(*agent_.last_round);
  place_ = place_workers(*round_, agent_.cfg.nproc_per_node);
  agent_.group->renumber(place_.first_rank);
}

void WorkerSupervisor::on_output_loss(std::shared_ptr<const OutputLoss> loss) {
  const char* stream = loss->stream == 1 ? "stdout" : "stderr";
  log_warning("cannot write local rank {}'s {} to {}: {}; the file stops here ({} byte(s) not "
              "written); from now on this output goes {}",
              loss->local_rank, stream, loss->path, std::strerror(loss->error), loss->bytes,
              loss->console_fallback ? "to the console instead (it was redirected there)"
                                     : "to the console only");
  agent_.monitor->events().emit("log_write_failed", {{"local_rank", loss->local_rank},
                                                {"stream", stream},
                                                {"path", loss->path},
                                                {"error", std::strerror(loss->error)},
                                                {"attempt", agent_.state().generation}});
  output_losses_.push_back(std::move(loss));
}

void WorkerSupervisor::report_output_losses() const {
  if (output_losses_.empty()) return;
  uint64_t total = 0;
  std::string files;
  for (const auto& loss : output_losses_) {
    total += loss->bytes;
    files += fmt::format("\n  {} ({}): {} byte(s) missing{}", loss->path,
                         std::strerror(loss->error), loss->bytes,
                         loss->console_fallback ? ", shown on the console instead" : "");
  }
  log_warning("worker output is missing from {} log file(s), {} byte(s) in all (free space on "
              "the --log_dir disk, or give another --log_dir):{}",
              output_losses_.size(), total, files);
}

void WorkerSupervisor::on_exec_failed(int64_t gen, int64_t local_rank,
                                      const std::string& message) {
  if (gen != agent_.state().generation || !agent_.group) return;
  if (!exec_failure_logged_) {
    exec_failure_logged_ = true;
    log_spawn_error(message);
  }
  bool was_final = agent_.group->final();
  agent_.group->on_exit(local_rank, ExitStatus::exited(127), agent_.opts.clock->now(),
                   std::chrono::system_clock::now());
  Event failed{Event::Kind::kExecFailed};
  failed.flag = was_final;
  failed.group = agent_.group->state();
  failed.all_exited = agent_.group->all_exited();
  agent_.post(failed);
}

void WorkerSupervisor::log_spawn_error(const std::string& message) {
  if (agent_.cfg.runs_python()) {
    log_error("{} (the interpreter for .py programs and -m; choose it with --python, e.g. "
              "--python /usr/bin/python3 for Debian's PyTorch)",
              message);
  } else {
    log_error("{}", message);
  }
}

}  // namespace dlaunch
