// Logging through fmt, to stderr, with a level chosen by DLAUNCH_LOG_LEVEL
// (debug | info | warning | error | off; default info). Thread-safe: each line is written
// with one write(2) so lines from threads and processes do not interleave mid-line.
//
//   dlaunch::log_info("rendezvous round {} complete: {} nodes", round, n);
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace dlaunch {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

// The level in force; read from DLAUNCH_LOG_LEVEL on first use.
LogLevel log_level();
void set_log_level(LogLevel level);
// Parses "debug", "info", "warning"/"warn", "error", "off" (case-insensitive); throws UsageError.
LogLevel parse_log_level(std::string_view text);
// A short tag shown in every line, e.g. "dlaunch" or "dtrain rank 3". Default "dlaunch".
void set_log_tag(std::string tag);

void log_line(LogLevel level, std::string_view message);

// The local time of day of now, "14:05:01.123": the stamp of log lines and of the console's
// --log_timestamps.
std::string time_of_day_now();

template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kDebug) log_line(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kInfo) log_line(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warning(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kWarning) log_line(LogLevel::kWarning, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kError) log_line(LogLevel::kError, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dlaunch
