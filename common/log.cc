#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <ctime>
#include <mutex>

#include "common/env.h"
#include "common/error.h"

namespace dlaunch {
namespace {

std::atomic<int> g_level{-1};
std::mutex g_tag_mutex;
std::string g_tag = "dlaunch";

const char* level_letter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "D";
    case LogLevel::kInfo: return "I";
    case LogLevel::kWarning: return "W";
    case LogLevel::kError: return "E";
    case LogLevel::kOff: return "-";
  }
  return "?";
}

}  // namespace

LogLevel parse_log_level(std::string_view text) {
  std::string lower;
  for (char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warning" || lower == "warn") return LogLevel::kWarning;
  if (lower == "error") return LogLevel::kError;
  if (lower == "off" || lower == "none") return LogLevel::kOff;
  throw UsageError(fmt::format(
      "DLAUNCH_LOG_LEVEL='{}' is not a log level; use debug, info, warning, error or off", text));
}

LogLevel log_level() {
  int level = g_level.load(std::memory_order_relaxed);
  if (level < 0) {
    LogLevel parsed = LogLevel::kInfo;
    if (auto text = get_env("DLAUNCH_LOG_LEVEL")) {
      try {
        parsed = parse_log_level(*text);
      } catch (const UsageError&) {
        parsed = LogLevel::kInfo;  // a bad level must not stop the program; say so once
        g_level.store(static_cast<int>(parsed));
        log_warning("DLAUNCH_LOG_LEVEL='{}' is not a log level (debug, info, warning, error, "
                    "off); using info", *text);
      }
    }
    g_level.store(static_cast<int>(parsed));
    level = static_cast<int>(parsed);
  }
  return static_cast<LogLevel>(level);
}

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }

void set_log_tag(std::string tag) {
  std::lock_guard<std::mutex> lock(g_tag_mutex);
  g_tag = std::move(tag);
}

std::string time_of_day_now() {
  auto now = std::chrono::system_clock::now();
  std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&seconds, &tm);
  return fmt::format("{:02}:{:02}:{:02}.{:03}", tm.tm_hour, tm.tm_min, tm.tm_sec, millis);
}

void log_line(LogLevel level, std::string_view message) {
  std::string tag;
  {
    std::lock_guard<std::mutex> lock(g_tag_mutex);
    tag = g_tag;
  }
  std::string line =
      fmt::format("[{} {} {}] {}\n", tag, time_of_day_now(), level_letter(level), message);
  // One write per line keeps lines whole; a short write to stderr is not worth retrying.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace dlaunch
