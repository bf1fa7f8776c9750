#include "launcher/status/job_events.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/log.h"

namespace dlaunch {

namespace {

std::string iso_utc(std::chrono::system_clock::time_point t) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", buf, static_cast<int>(ms % 1000));
}

}  // namespace

std::string json_quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

EventValue::EventValue(double v) : json_(std::isfinite(v) ? fmt::format("{}", v) : "null") {}
EventValue::EventValue(const std::string& v) : json_(json_quote(v)) {}
EventValue::EventValue(const std::vector<std::string>& v) {
  json_ = "[";
  for (size_t i = 0; i < v.size(); ++i) json_ += (i ? "," : "") + json_quote(v[i]);
  json_ += "]";
}

JobEvents::~JobEvents() {
  close();
}

void JobEvents::open(const std::string& path, std::string host, int agent_pid) {
  std::lock_guard<std::mutex> lock(mutex_);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    log_warning("cannot write the job timeline {}: {}; continuing without it", path,
                std::strerror(errno));
    return;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  path_ = path;
  host_ = std::move(host);
  agent_pid_ = agent_pid;
}

void JobEvents::emit(const std::string& event, const EventFields& fields) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) return;
  auto wall = std::chrono::system_clock::now();
  auto mono = std::chrono::steady_clock::now();
  std::string line = fmt::format(
      "{{\"time\":{:.6f},\"time_iso\":\"{}\",\"mono\":{:.6f},\"host\":{},\"agent_pid\":{},"
      "\"event\":{}",
      std::chrono::duration<double>(wall.time_since_epoch()).count(), iso_utc(wall),
      std::chrono::duration<double>(mono.time_since_epoch()).count(), json_quote(host_), agent_pid_,
      json_quote(event));
  for (const auto& [key, value] : fields) line += "," + json_quote(key) + ":" + value.json();
  line += "}\n";
  if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    log_warning("cannot append to the job timeline {}: {}; no more events are written", path_,
                std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
  }
}

void JobEvents::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

nlohmann::json parse_timeline(const std::string& text) {
  nlohmann::json out = nlohmann::json::array();
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

nlohmann::json merge_timelines(const std::vector<nlohmann::json>& timelines) {
  std::vector<nlohmann::json> all;
  for (const auto& t : timelines) {
    for (const auto& e : t) all.push_back(e);
  }
  std::stable_sort(all.begin(), all.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return a.value("time", 0.0) < b.value("time", 0.0);
  });
  return nlohmann::json(all);
}

std::string format_event_line(const nlohmann::json& e) {
  static const std::vector<std::string> kFixed = {"time", "time_iso",  "mono",
                                                  "host", "agent_pid", "event"};
  std::string iso = e.value("time_iso", std::string());
  std::string when = iso.size() >= 23 ? iso.substr(11, 12) : iso;
  std::string out = fmt::format("{} {}[{}] {}", when, e.value("host", std::string("?")),
                                e.value("agent_pid", 0), e.value("event", std::string("?")));
  for (auto it = e.begin(); it != e.end(); ++it) {
    if (std::find(kFixed.begin(), kFixed.end(), it.key()) != kFixed.end()) continue;
    std::string v = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
    out += fmt::format(" {}={}", it.key(), v);
  }
  return out;
}

}  // namespace dlaunch
