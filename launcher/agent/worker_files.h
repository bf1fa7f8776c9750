// The files of this run's workers: --log_dir's run directory (run_dir.h), or, without --log_dir,
// a temporary one under $TMPDIR that a success deletes unless it holds -r/-t output; under it
// attempt_<n>/<local rank>/ per generation (error file, heartbeat, stacks, output).
// Loop thread only; nothing here blocks beyond the file system.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "launcher/config/launch_config.h"
#include "launcher/process/process_context.h"
#include "launcher/process/worker_group.h"

namespace dlaunch {

class WorkerFiles {
 public:
  // Makes the run directory. Throws UsageError when the temporary one cannot be made, what
  // create_run_dir throws for --log_dir.
  void open(const LaunchConfig& cfg, ProcessContext& procs);

  const std::string& path() const { return path_; }

  // The records of generation `generation`'s workers, global ranks from `first_rank`, with their
  // directories made; nullopt after logging why a directory cannot be made (an attempt directory
  // is never replaced: one that exists was written by someone else).
  std::optional<std::vector<WorkerRecord>> make_attempt(int64_t generation, int64_t first_rank,
                                                        int64_t nproc);
  // Makes generation `generation`'s directories ahead, while the rendezvous forms, so the
  // mkdirs are not on the path from the round's end to the workers; make_attempt then uses
  // them (`nproc` is the agent's fixed --nproc_per_node, as make_attempt's). Quiet on failure:
  // make_attempt tries again and says why. Loop thread only.
  void prepare_attempt(int64_t generation, int64_t nproc);

  // The job ended with `exit_code`: a temporary directory is deleted after a success or a
  // program that never started, else kept and named in the log.
  void close(int exit_code);

 private:
  void drop_prepared();

  std::string path_;
  bool temp_ = false;
  bool keep_temp_ = false;  // it holds redirected/teed output: never deleted
  // prepare_attempt's directories, made and not yet used by make_attempt (-1: none). close()
  // removes them: a job that ends before its round leaves no empty attempt in --log_dir.
  int64_t prepared_generation_ = -1;
};

}  // namespace dlaunch
