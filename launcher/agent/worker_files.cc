#include "launcher/agent/worker_files.h"

#include <fmt/format.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/log.h"
#include "launcher/agent/agent.h"
#include "launcher/hang/heartbeat_file.h"
#include "launcher/output/log_router.h"
#include "launcher/config/run_dir.h"

namespace dlaunch {
namespace fs = std::filesystem;

void WorkerFiles::open(const LaunchConfig& cfg, ProcessContext& procs) {
  if (!cfg.log_dir.empty()) {
    // This run's own directory: never one another job (or an earlier run) writes into.
    RunDir dir = create_run_dir(cfg.log_dir, cfg.run_id, run_id_named_by_user(cfg));
    path_ = dir.path;
    if (!dir.note.empty()) log_warning("{}", dir.note);
    log_info("worker logs go to {}", path_);
    return;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = fmt::format("{}/dlaunch_{}_XXXXXX", tmp && *tmp ? tmp : "/tmp", cfg.run_id);
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) {
    // The user's environment, not the job, is at fault: a usage error (exit 2) that says so.
    throw UsageError(fmt::format(
        "cannot create the job's worker directory {}: {}; set TMPDIR to a writable directory "
        "or give --log_dir",
        templ, std::strerror(errno)));
  }
  path_ = buf.data();
  temp_ = true;
  // -r/-t output exists only in these files: deleting them on success would lose it.
  for (int64_t local_rank = 0; local_rank < cfg.nproc_per_node; ++local_rank) {
    keep_temp_ |= writes_file(cfg, local_rank, 1) || writes_file(cfg, local_rank, 2);
  }
  if (keep_temp_) {
    log_warning(
        "--redirects/--tee without --log_dir: the workers' output files go to {} "
        "and stay there after the job; give --log_dir to choose the place",
        path_);
  } else if (!procs.remove_on_agent_death(path_)) {
    // A failed job keeps it and says where (close); an agent killed outright cannot say, so
    // the orphan guard removes it rather than leave litter in $TMPDIR.
    log_debug("the orphan guard cannot take {}: it stays if dlaunch is killed", path_);
  }
}

namespace {
std::string attempt_path(const std::string& run_dir, int64_t generation) {
  return fmt::format("{}/attempt_{}", run_dir, generation);
}
std::string worker_path(const std::string& attempt_dir, int64_t local_rank) {
  return fmt::format("{}/{}", attempt_dir, local_rank);
}
}  // namespace

void WorkerFiles::prepare_attempt(int64_t generation, int64_t nproc) {
  if (path_.empty() || prepared_generation_ >= 0) return;
  const std::string attempt_dir = attempt_path(path_, generation);
  std::error_code ec;
  // Only a directory this call creates counts: one that exists is make_attempt's error to tell.
  if (!fs::create_directory(attempt_dir, ec)) return;
  for (int64_t local_rank = 0; local_rank < nproc; ++local_rank) {
    if (!fs::create_directory(worker_path(attempt_dir, local_rank), ec)) {
      fs::remove_all(attempt_dir, ec);
      return;
    }
  }
  prepared_generation_ = generation;
}

std::optional<std::vector<WorkerRecord>> WorkerFiles::make_attempt(int64_t generation,
                                                                   int64_t first_rank,
                                                                   int64_t nproc) {
  std::string attempt_dir = attempt_path(path_, generation);
  std::error_code ec;
  const bool prepared = prepared_generation_ == generation;
  if (prepared_generation_ >= 0 && !prepared) drop_prepared();
  prepared_generation_ = -1;
  // Never replace an attempt directory. The run directory is this run's own (open()), so one
  // that exists was written by someone else: stop rather than delete or mix into it.
  if (!prepared && !fs::create_directory(attempt_dir, ec)) {
    std::string why =
        ec ? ec.message() : "it already exists (another process writes into " + path_ + ")";
    log_error("cannot create {}: {}; not replacing it: give this job its own --log_dir (or "
              "--rdzv_id)",
              attempt_dir, why);
    return std::nullopt;
  }
  std::vector<WorkerRecord> records;
  for (int64_t local_rank = 0; local_rank < nproc; ++local_rank) {
    WorkerRecord w;
    w.local_rank = local_rank;
    w.global_rank = first_rank + local_rank;
    w.log_dir = worker_path(attempt_dir, local_rank);
    if (!prepared) fs::create_directories(w.log_dir, ec);
    if (ec) {
      log_error("cannot create {}: {}", w.log_dir, ec.message());
      return std::nullopt;
    }
    w.error_file = w.log_dir + "/error.json";
    w.heartbeat_file = w.log_dir + "/heartbeat";
    if (!arm_heartbeat_file(w.heartbeat_file)) {
      log_warning("cannot prepare the heartbeat file {}: {}; a beat in the worker's first "
                  "milliseconds may be missed by --hang_timeout",
                  w.heartbeat_file, std::strerror(errno));
    }
    records.push_back(std::move(w));
  }
  return records;
}

void WorkerFiles::drop_prepared() {
  std::error_code ec;
  fs::remove_all(attempt_path(path_, prepared_generation_), ec);  // made empty by this agent
  prepared_generation_ = -1;
}

namespace {

// Whether `file` (a worker's, or the run's) can explain anything: an error file, a stack, some
// output. Heartbeats, the job's events and a Python stack file holding only its header cannot.
bool explains_something(const fs::directory_entry& file) {
  std::error_code ec;
  if (!file.is_regular_file(ec) || file.file_size(ec) == 0 || ec) return false;
  const std::string name = file.path().filename().string();
  if (name == "error.json" || name == "stack.txt" || name == "stdout.log" ||
      name == "stderr.log") {
    return true;
  }
  if (name == "py_stack.txt") {
    std::ifstream in(file.path());
    std::string line;
    while (std::getline(in, line)) {
      if (line.find("File \"") != std::string::npos) return true;  // a frame of a dumped stack
    }
  }
  return false;
}

bool holds_something_of_value(const std::string& dir) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (explains_something(*it)) return true;
  }
  return false;
}

}  // namespace

void WorkerFiles::close(int exit_code) {
  if (prepared_generation_ >= 0) drop_prepared();
  if (!temp_) return;
  // Kept when it may explain something (error files, stacks, output); a success keeps only -r/-t
  // output, which exists nowhere else.
  const bool success = exit_code == exit_codes::kSuccess;
  if (keep_temp_ && exit_code != exit_codes::kUsage) {
    log_info("worker output files (--redirects/--tee) are kept in {}", path_);
  } else if (!success && exit_code != exit_codes::kUsage && holds_something_of_value(path_)) {
    log_info("worker files (error files, stacks, output) are kept in {}", path_);
  } else {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
}

}  // namespace dlaunch
