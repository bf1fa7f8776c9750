// Where a worker's output lines go: the console, prefixed as torchrun prefixes them
// ("[default0]:"), and/or per-rank files, following --redirects, --tee, --local_ranks_filter and
// --log_dir:
//   console: unless the stream is redirected (-r) for that rank, or the rank is filtered out;
//   file:    when --log_dir is given, or the stream is redirected or teed (then the run's
//            temporary directory holds the files).
// Each line is written with one write(2), so lines from different workers never interleave
// mid-line. Blocks only as long as the console or disk does. Throws SystemError when a log file
// cannot be created.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "launcher/launch_config.h"

namespace dlaunch {

class WorkerOutput {
 public:
  // `rank_dir`: the worker's directory for this attempt (created by the caller).
  WorkerOutput(const LaunchConfig& cfg, int64_t local_rank, const std::string& rank_dir);
  ~WorkerOutput();
  WorkerOutput(const WorkerOutput&) = delete;
  WorkerOutput& operator=(const WorkerOutput&) = delete;

  // stream: 1 stdout, 2 stderr.
  void line(int stream, std::string_view text);

  bool to_console(int stream) const { return console_[stream]; }
  bool to_file(int stream) const { return file_fd_[stream] >= 0; }

 private:
  std::string prefix_;
  bool console_[3] = {false, false, false};
  int file_fd_[3] = {-1, -1, -1};
};

// True when the configuration writes this rank's stream to a file.
bool writes_file(const LaunchConfig& cfg, int64_t local_rank, int stream);

}  // namespace dlaunch
