// <output_dir>/events.out.tfevents.<seconds>.<host>: the scalars of metrics.jsonl as a TensorBoard
// event file, for `tensorboard --logdir <output_dir>`. It is fed the records MetricsLog wrote
// (as stamped there), so the two always agree: every number of a "step" or "epoch" record becomes
// the scalar "<kind>/<field>" (step/loss, epoch/test_accuracy, ...) at the record's global step,
// with the record's "time" as its wall time; "step", "attempt" and "time" themselves are not
// curves. Other kinds of records (start, data) have no scalars.
//
// One file holds the whole history, each step once: where a run or a restarted attempt starts,
// the file is written anew from metrics.jsonl's surviving records (svg_plot.h: a step redone
// after a restart keeps the newest attempt's line) under a new name, and the directory's other
// event files are deleted; records are then appended and flushed one by one, like metrics.jsonl.
// The event file is derived data and never read back: a record torn by a crash is skipped by
// TensorBoard's reader (its CRCs do not match), and the next start replaces the file. Only rank 0
// writes. Blocks on the writes; I/O failures throw SystemError.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dlaunch::metrics {

class TensorBoardLog {
 public:
  // Writes the new event file in `dir` with the scalars of `history` (metrics records in the
  // order they survive, e.g. surviving_records(read_metrics(...))) and deletes the older ones.
  TensorBoardLog(const std::string& dir, const std::vector<nlohmann::json>& history);
  TensorBoardLog(const TensorBoardLog&) = delete;
  TensorBoardLog& operator=(const TensorBoardLog&) = delete;

  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event_bytes);

  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::string path_;
  std::unique_ptr<std::FILE, Closer> file_;
};

// The scalars TensorBoardLog writes for one metrics record: (tag, value) pairs.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& record);

// Deletes the TensorBoard event files in `dir` (named events.out.tfevents.*) other than `keep`
// (a file name); returns how many. Throws SystemError when one cannot be deleted.
int remove_event_files(const std::string& dir, const std::string& keep = "");

}  // namespace dlaunch::metrics
