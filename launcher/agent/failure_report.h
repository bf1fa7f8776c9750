// The end-of-job summary: the first failure (the root cause) in full, then the other workers'
// ends summarised as its consequences. Modelled on torchrun's ChildFailedError report, with the
// signal's name and the stderr tail when the worker wrote no error file. Pure formatting plus
// reading the error file; never throws (an unreadable error file is said so in the report).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launcher/hang/hang_exchange.h"
#include "launcher/process/worker_group.h"

namespace dlaunch {

// What a TORCHELASTIC_ERROR_FILE says, in PyTorch's format (torch.distributed.elastic.
// multiprocessing.errors): {"message": {"message": "...", "extraInfo": {"py_callstack": "...",
// "timestamp": "..."}}} or the older {"message": "...", "timestamp": ...}.
struct ErrorFileContents {
  std::string message;    // "ValueError: boom"
  std::string traceback;  // py_callstack, when present
  std::string timestamp;  // seconds since the epoch, as written
  std::string raw;        // the file, when it is not in that format (shown as is, cut)
};
// nullopt when the file does not exist or is empty.
std::optional<ErrorFileContents> read_error_file(const std::string& path);

struct ReportContext {
  std::string host;
  // Tell apart the nodes of one host: this node's rank in the last round (-1: none, or a
  // single node) and its --local_addr (empty, or the host name: not shown).
  int64_t node_rank = -1;
  std::string local_addr;
  // "dlaunch 0.1.0 (commit e8ba0f2, Release build)": a report pasted into a bug says what ran.
  // Empty: no line.
  std::string version;
  int64_t max_restarts = 0;
  int64_t restarts_used = 0;
  Duration hang_timeout{0};
  bool hang_timeout_auto = false;  // --hang_timeout auto: hang_timeout is its start-up timeout
  // One line per earlier attempt that failed: "attempt 0: rank 1 exit code 3".
  std::vector<std::string> earlier;
  // "pid 123 (state D)" for processes that would not die.
  std::vector<std::string> stuck;
  // This node's timeline (job_events.h); empty: no line.
  std::string events_file;
  // A hang whose stuck rank is on another node (hang_exchange.h): the report names that rank as
  // the root cause and this node's workers as its victims.
  std::optional<NodeHangVerdict> stuck_elsewhere;
};

// "2026-11-22_17:04:05.123" in local time.
std::string format_wall_time(std::chrono::system_clock::time_point t);
// "rank 1 (local_rank 1, pid 4242): exit code 3" for the one-line summaries.
std::string describe_end(const WorkerRecord& w, Duration hang_timeout);
// How long a hung worker was silent: "more than 6.0 s (--hang_timeout)" (`hang_timeout`), or for
// one declared by --hang_timeout auto "1.3 s, more than 1.0 s (--hang_timeout auto: 5 x the
// longest gap seen, 0.20 s)" (its own record).
std::string hang_silence(const WorkerRecord& w, Duration hang_timeout);

std::string format_failure_report(const WorkerGroup& group, const ReportContext& ctx);

}  // namespace dlaunch
