// What the console shows of one worker stream: its raw bytes cut into lines, each line (and
// each '\r'-separated update of a progress bar) started with the rank's prefix ("[default0]:"),
// as torchrun shows them. The log files get the raw bytes instead (log_router.h).
//
//   feed():  complete lines ('\n', "\r\n") and '\r' updates go out at once, whole; the
//            unterminated tail waits, since the next chunk usually completes it.
//   flush(): a tail that waited long enough (a prompt, a progress bar drawn without '\n')
//            goes out without a newline; what follows continues that console line unprefixed.
//   finish(): the worker exited: the tail goes out and an open line is ended with '\n'.
// A line that grows past kMaxConsoleLine is cut for the console, and the cut says so; the log
// file keeps it whole. With a ConsoleStyle, whole lines go through a fold shared by the
// stream's workers (--log_fold, console_fold.h) and each console line starts with a timestamp
// (--log_timestamps). Pure: no I/O, time is passed in. Never throws (but bad_alloc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "launcher/output/console_fold.h"

namespace dlaunch {

inline constexpr size_t kMaxConsoleLine = 64 * 1024;
// Ends each console piece of a line cut at kMaxConsoleLine (the next piece is prefixed again).
inline constexpr std::string_view kLineCutNote = " [dlaunch: line over 64 KiB, continues below]\n";

// How console lines look beyond the prefix.
struct ConsoleStyle {
  ConsoleFold* fold = nullptr;  // --log_fold: whole lines go through it; not owned
  int64_t rank = 0;             // this worker's local rank, for the fold
  // --log_timestamps: what goes before each console line's prefix ("14:05:01.123 "); null: none.
  std::function<std::string()> stamp;
};

class ConsoleLines {
 public:
  explicit ConsoleLines(std::string prefix, ConsoleStyle style = {})
      : prefix_(std::move(prefix)), style_(std::move(style)) {}

  // Appends to `out` the console bytes that `bytes` completes. `now`: when they arrived.
  void feed(std::string_view bytes, TimePoint now, std::string& out);
  // Appends the pending tail if it has waited at least `min_age` since its first byte.
  void flush(TimePoint now, Duration min_age, std::string& out);
  // With a fold: this rank's held lines may stay held for the other ranks (until the fold's
  // wait ends, or the last rank finishes).
  void finish(std::string& out);
  // When the pending tail's first byte arrived; nullopt when nothing is pending.
  std::optional<TimePoint> pending_since() const;

 private:
  // Appends prefix (unless the console line already has it), pending_, `more`, `terminator`.
  void emit(std::string_view more, std::string_view terminator, std::string& out);
  void hold(std::string_view more, TimePoint now, std::string& out);
  // The start of a new console line: timestamp and prefix.
  void start_line(std::string& out);

  std::string prefix_;
  ConsoleStyle style_;
  TimePoint now_{};  // of the bytes being handled, for the fold
  std::string pending_;
  bool pending_cr_ = false;  // a chunk ended in '\r': the next byte tells "\r\n" from an update
  bool line_open_ = false;   // the console line already shows its prefix (a flushed tail)
  TimePoint since_{};
};

}  // namespace dlaunch
