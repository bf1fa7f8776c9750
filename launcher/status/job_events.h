// The job's timeline: every agent appends what happens to it, one JSON object a line, to
// <run dir>/events.jsonl (the run directory is <log_dir>/<run_id>[_<random>], run_dir.h).
// `dlaunch status --events` merges every node's timeline into one view ordered by wall time
// (job_control.h); the failure report names the file.
//
// Each line: {"time": <Unix seconds, float>, "time_iso": "2026-11-23T14:05:01.123Z",
// "mono": <seconds on this agent's steady clock>, "host": ..., "agent_pid": ..., "event": kind,
// ...fields}. The event kinds and their fields are listed in docs/monitoring.md.
//
// Lines are written by a small encoder of their own (fields arrive already encoded, one
// write(2) per event); reading timelines back (below) uses nlohmann::json.
//
// Threading: emit() may be called from any thread (a mutex orders the lines). Each line is one
// write(2) on an O_APPEND descriptor, so a reader never sees half a line. An unwritable file is
// reported once and events are dropped after that; emit() never throws.
#pragma once

#include <cstddef>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dlaunch {

// One field's value, encoded as JSON text when built: an integer, a number, a bool, a string, a
// list of strings, or null.
class EventValue {
 public:
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  EventValue(T v) : json_(std::to_string(v)) {}  // NOLINT: implicit by design
  EventValue(bool v) : json_(v ? "true" : "false") {}
  EventValue(double v);
  EventValue(const char* v) : EventValue(std::string(v)) {}
  EventValue(const std::string& v);
  EventValue(const std::vector<std::string>& v);
  EventValue(std::nullptr_t) : json_("null") {}
  const std::string& json() const { return json_; }

 private:
  std::string json_;
};
using EventFields = std::vector<std::pair<std::string, EventValue>>;

// `text` as a JSON string literal, quotes included.
std::string json_quote(const std::string& text);

class JobEvents {
 public:
  JobEvents() = default;
  ~JobEvents();
  JobEvents(const JobEvents&) = delete;
  JobEvents& operator=(const JobEvents&) = delete;

  // Appends to `path` (created if missing). Events emitted before open() are dropped.
  void open(const std::string& path, std::string host, int agent_pid);
  void emit(const std::string& event, const EventFields& fields = {});
  // "" until open().
  const std::string& path() const { return path_; }
  void close();

 private:
  std::mutex mutex_;
  int fd_ = -1;
  std::string path_;
  std::string host_;
  int agent_pid_ = 0;
};

// The events of several timelines (each a vector of parsed lines) in one list ordered by wall
// time; lines of one file keep their order when their times are equal.
nlohmann::json merge_timelines(const std::vector<nlohmann::json>& timelines);
// Parses events.jsonl text; lines that are not JSON objects are skipped.
nlohmann::json parse_timeline(const std::string& text);
// One line for people: "14:05:01.123 node-a[2] worker_exited rank=3 exit_code=1".
std::string format_event_line(const nlohmann::json& event);

}  // namespace dlaunch
