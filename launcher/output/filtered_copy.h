// torchrun 2.x's --duplicate_stdout_filters / --duplicate_stderr_filters: the teed (-t) lines of
// every local rank --local_ranks_filter shows that contain any of the filter texts are copied,
// with the rank's console prefix, to one file per stream in the attempt's directory:
// attempt_<n>/filtered_stdout.log and filtered_stderr.log, as torchrun names them. A line is copied once complete (with its
// '\n'), or when its worker exits (without one). Loop thread only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "launcher/config/launch_config.h"

namespace dlaunch {

class FilteredCopy {
 public:
  // Null when neither filter list was given. Throws SystemError when a file cannot be created.
  static std::unique_ptr<FilteredCopy> open(const LaunchConfig& cfg,
                                            const std::string& attempt_dir);
  ~FilteredCopy();
  FilteredCopy(const FilteredCopy&) = delete;
  FilteredCopy& operator=(const FilteredCopy&) = delete;

  // A worker's output; `prefix` is its console prefix. Streams not teed for the rank are skipped.
  void feed(int64_t local_rank, int stream, std::string_view bytes, const std::string& prefix);
  // The worker exited: its unterminated last line is matched as it is.
  void finish(int64_t local_rank, const std::string& prefix);

 private:
  explicit FilteredCopy(const LaunchConfig& cfg) : cfg_(cfg) {}
  void copy_if_matching(int stream, const std::string& line, const std::string& prefix);

  const LaunchConfig& cfg_;
  int fd_[3] = {-1, -1, -1};
  std::string path_[3];
  std::map<std::pair<int64_t, int>, std::string> pending_;  // (local rank, stream) -> open line
};

}  // namespace dlaunch
