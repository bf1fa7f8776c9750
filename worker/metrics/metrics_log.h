// <output_dir>/metrics.jsonl: one JSON object per line, per logged step ("kind": "step") and
// per epoch ("kind": "epoch"), and one where each run or restarted attempt starts ("kind":
// "start", at the global step it resumed from). Values are already reduced over all workers by
// the caller (mean loss and accuracy, the whole job's images/s). Every record carries the
// attempt that wrote it ("attempt": TORCHELASTIC_RESTART_COUNT, 0 without a launcher), so the
// steps a restarted attempt redoes can be told from the first try's, and the time it was written
// ("time": seconds since the Unix epoch; TensorBoard's wall time). Only rank 0 writes.
// Appends, so a resumed run continues the same file (a torn last line from a crash is ended
// first); each line is flushed as it is written, so a crash loses nothing logged before it.
// Blocks on the write; I/O failures throw SystemError.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dlaunch::metrics {

class MetricsLog {
 public:
  // `attempt` is stamped on every record written.
  MetricsLog(const std::string& path, int64_t attempt);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Returns the record as written (stamped), for the logs fed the same records.
  nlohmann::json write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int64_t attempt_;
  std::FILE* file_ = nullptr;
};

// Reads back a metrics.jsonl (lines that do not parse are skipped: a torn last line after a
// crash must not stop a resumed run from plotting).
std::vector<nlohmann::json> read_metrics(const std::string& path);

}  // namespace dlaunch::metrics
