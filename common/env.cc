#include "common/env.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "common/error.h"

namespace dlaunch {

std::optional<std::string> get_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::string get_env_or(const char* name, const std::string& fallback) {
  auto value = get_env(name);
  return value ? *value : fallback;
}

int64_t parse_int(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    throw UsageError(fmt::format("{}='{}' is not an integer; expected a decimal number such as 4",
                                 what, text));
  }
  return value;
}

double parse_double(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    throw UsageError(
        fmt::format("{}='{}' is not a number; expected a decimal number such as 2.5", what, text));
  }
  return value;
}

bool parse_bool(const std::string& text, const std::string& what) {
  std::string lower;
  for (char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "0" || lower == "false" || lower == "no" || lower == "off") return false;
  throw UsageError(fmt::format(
      "{}='{}' is not a boolean; expected one of 1/0, true/false, yes/no, on/off", what, text));
}

std::optional<int64_t> get_env_int(const char* name) {
  auto value = get_env(name);
  if (!value) return std::nullopt;
  return parse_int(*value, name);
}

std::optional<bool> get_env_bool(const char* name) {
  auto value = get_env(name);
  if (!value) return std::nullopt;
  return parse_bool(*value, name);
}

std::optional<double> get_env_double(const char* name) {
  auto value = get_env(name);
  if (!value) return std::nullopt;
  return parse_double(*value, name);
}

}  // namespace dlaunch
