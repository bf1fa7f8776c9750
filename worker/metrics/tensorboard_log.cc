#include "worker/metrics/tensorboard_log.h"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "common/error.h"
#include "worker/metrics/tensorboard_event.pb.h"
#include "worker/metrics/tf_record.h"

namespace dlaunch::metrics {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kEventFilePrefix = "events.out.tfevents.";
// What a user can do about a failing event file when the rest of the output directory works.
constexpr const char* kTurnOff = " (--tensorboard=false trains without event files)";

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// TensorBoard's reader takes a file for an event file by its name; the seconds and the host are
// TensorFlow's convention, so files of several runs sort by when they began.
std::string event_file_name() {
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  return fmt::format("{}{:010d}.{}", kEventFilePrefix, secs, host_name());
}

// TensorBoard reads a file as events only after this first record.
std::string file_version_event() {
  tensorboard::Event e;
  e.set_wall_time(now_seconds());
  e.set_file_version("brain.Event:2");
  return e.SerializeAsString();
}

// "" for a record without scalars.
std::string scalar_event(const json& record) {
  const auto scalars = tensorboard_scalars(record);
  if (scalars.empty()) return {};
  tensorboard::Event e;
  const json& time = record.contains("time") ? record["time"] : json();
  e.set_wall_time(time.is_number() ? time.get<double>() : now_seconds());
  e.set_step(record.value("step", int64_t{0}));
  for (const auto& [tag, value] : scalars) {
    tensorboard::Summary::Value* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return e.SerializeAsString();
}

}  // namespace

std::vector<std::pair<std::string, double>> tensorboard_scalars(const json& record) {
  std::vector<std::pair<std::string, double>> out;
  const std::string kind = record.value("kind", std::string());
  if (kind != "step" && kind != "epoch") return out;
  for (const auto& [field, value] : record.items()) {
    // The x axis and the wall time are the event's own fields; the attempt is bookkeeping.
    if (field == "step" || field == "time" || field == "attempt") continue;
    // Numbers only (a bool is not one to nlohmann::json): `complete` is no curve.
    if (value.is_number()) out.emplace_back(kind + "/" + field, value.get<double>());
  }
  return out;
}

int remove_event_files(const std::string& dir, const std::string& keep) {
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kEventFilePrefix, 0) != 0 || name == keep) continue;
    std::error_code rm;
    if (!fs::remove(entry.path(), rm) && rm) {
      throw SystemError(
          fmt::format("deleting the old TensorBoard event file {}: {}; expected a "
                      "writable output directory{}",
                      entry.path().string(), rm.message(), kTurnOff));
    }
    ++removed;
  }
  return removed;
}

TensorBoardLog::TensorBoardLog(const std::string& dir, const std::vector<json>& history) {
  const std::string name = event_file_name();
  path_ = (fs::path(dir) / name).string();
  // Written aside and renamed, so a TensorBoard watching the directory never reads half a
  // history. The name has no "tfevents" in it: TensorBoard ignores it until the rename.
  const std::string temp = (fs::path(dir) / ".tensorboard_events.tmp").string();
  file_.reset(std::fopen(temp.c_str(), "wb"));
  if (!file_) {
    throw SystemError(errno_message("creating TensorBoard event file " + temp, errno) + kTurnOff);
  }
  append(file_version_event());
  // The file is sorted by step, as a live run writes it: step lines before the epoch line of
  // the same step.
  std::vector<json> ordered = history;
  std::stable_sort(ordered.begin(), ordered.end(), [](const json& a, const json& b) {
    return a.value("step", int64_t{0}) < b.value("step", int64_t{0});
  });
  for (const json& record : ordered) {
    std::string event = scalar_event(record);
    if (!event.empty()) append(event);
  }
  if (std::rename(temp.c_str(), path_.c_str()) != 0) {
    throw SystemError(errno_message("renaming " + temp + " to " + path_, errno) + kTurnOff);
  }
  remove_event_files(dir, name);
}

void TensorBoardLog::write(const json& record) {
  std::string event = scalar_event(record);
  if (!event.empty()) append(event);
}

void TensorBoardLog::append(const std::string& event_bytes) {
  const std::string framed = frame_tf_record(event_bytes);
  if (std::fwrite(framed.data(), 1, framed.size(), file_.get()) != framed.size() ||
      std::fflush(file_.get()) != 0) {
    throw SystemError(errno_message("writing TensorBoard event file " + path_, errno) + kTurnOff);
  }
}

}  // namespace dlaunch::metrics
