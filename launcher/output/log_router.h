// Where a worker's output goes: the console, prefixed as torchrun prefixes it ("[default0]:"),
// and/or per-rank files, following --redirects, --tee, --local_ranks_filter and --log_dir:
//   console: unless the stream is redirected (-r) and not teed (-t) for that rank (tee wins, as
//            in torchrun), or the rank is filtered out (LaunchConfig::console_shows);
//   file:    when --log_dir is given, or the stream is redirected or teed (then the run's
//            temporary directory holds the files).
// A file receives exactly the bytes the worker wrote. The console receives whole lines
// (console_lines.h), several per write(2) when they arrive together, so lines from different
// workers never interleave mid-line; an unterminated tail (a prompt, a '\r' progress bar) shows
// once it has waited kPartialLineDelay. Blocks only as long as the console or disk does.
// Throws SystemError when a log file cannot be created.
//
// A log file that cannot be written (a full disk: ENOSPC) is not written again, so it stays an
// exact prefix of the output; the loss is reported at once through the callback, and from then
// on the stream goes to the console even where it was redirected (-r), so nothing is lost.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "launcher/output/console_lines.h"
#include "launcher/config/launch_config.h"

namespace dlaunch {

// How long an unterminated tail waits for the rest of its line before the console shows it.
inline constexpr Duration kPartialLineDelay = std::chrono::milliseconds(100);

// What the console of one generation's workers shares: a fold per stream (--log_fold; a held
// fold goes out after kPartialLineDelay, like a tail).
struct SharedConsole {
  std::optional<ConsoleFold> fold[3];
};
// Null when there is nothing to share (no --log_fold); a stream shown for fewer than two ranks
// gets no fold.
std::shared_ptr<SharedConsole> make_shared_console(const LaunchConfig& cfg);

// A worker's log file that a write to failed. The writer keeps counting into it.
struct OutputLoss {
  int64_t local_rank = 0;
  int stream = 1;       // 1 stdout, 2 stderr
  std::string path;     // the log file
  int error = 0;        // errno of the failed write (ENOSPC, EDQUOT, EIO...)
  uint64_t bytes = 0;   // the output missing from the file
  bool console_fallback = false;  // the stream was not on the console before the failure
};
using OutputLossCallback = std::function<void(std::shared_ptr<const OutputLoss>)>;

class WorkerOutput {
 public:
  // `rank_dir`: the worker's directory for this attempt (created by the caller).
  // `shared`: from make_shared_console, the same for every worker of the generation.
  // `on_loss`: called once per stream, at its log file's first failed write.
  // `prefix`: what starts each console line; "" : torchrun's "[<role><local_rank>]:".
  // `append`: keep what the files hold (a rank replaced in process: the failed worker's output
  // stays above its replacement's).
  WorkerOutput(const LaunchConfig& cfg, int64_t local_rank, const std::string& rank_dir,
               std::shared_ptr<SharedConsole> shared = nullptr, OutputLossCallback on_loss = {},
               std::string prefix = "", bool append = false);
  ~WorkerOutput();
  WorkerOutput(const WorkerOutput&) = delete;
  WorkerOutput& operator=(const WorkerOutput&) = delete;

  // stream: 1 stdout, 2 stderr. `bytes`: the next chunk the worker wrote; `now`: its arrival.
  void write(int stream, std::string_view bytes, TimePoint now);
  // Shows the console tails that have waited kPartialLineDelay.
  void flush_due(TimePoint now);
  // The worker exited: shows every tail and ends an open console line.
  void finish();
  // When the earliest pending console tail becomes due; nullopt when none is pending.
  std::optional<TimePoint> next_due() const;

 private:
  void show(int stream, const std::string& text);
  // The log file of `stream` took only part of a write; `rest` is what it did not take.
  void on_file_failed(int stream, std::string_view rest, int error);

  std::shared_ptr<SharedConsole> shared_;
  std::optional<ConsoleLines> console_[3];
  int file_fd_[3] = {-1, -1, -1};
  std::string path_[3];
  std::shared_ptr<OutputLoss> loss_[3];
  OutputLossCallback on_loss_;
  int64_t local_rank_;
  std::string prefix_;          // "[default0]:"
  ConsoleStyle style_[3];       // for a console copy started after a failed file write
  std::string scratch_;  // console bytes being assembled (kept to reuse its capacity)
};

// The console prefix of a worker's lines: --log_line_prefix_template rendered for it
// (torchrun_flags.h), else torchrun's "[<role><local_rank>]:".
std::string console_prefix(const LaunchConfig& cfg, int64_t local_rank, int64_t rank,
                           const std::string& hostname);

// True when the configuration writes this rank's stream to a file.
bool writes_file(const LaunchConfig& cfg, int64_t local_rank, int stream);

}  // namespace dlaunch
