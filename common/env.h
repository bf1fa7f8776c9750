// Environment getters. Parsing failures throw UsageError naming the variable, the value and
// what is allowed, so a typo in a job script is reported instead of silently defaulted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dlaunch {

// The value of `name`, or nullopt when unset. An empty value counts as set.
std::optional<std::string> get_env(const char* name);
std::string get_env_or(const char* name, const std::string& fallback);
// Decimal integer; throws UsageError on anything else.
std::optional<int64_t> get_env_int(const char* name);
// 1/0, true/false, yes/no, on/off (case-insensitive); throws UsageError on anything else.
std::optional<bool> get_env_bool(const char* name);
// Decimal number of seconds (fractions allowed); throws UsageError on anything else.
std::optional<double> get_env_double(const char* name);

// Parsers shared with the CLI; `what` names the flag or variable in the error message.
int64_t parse_int(const std::string& text, const std::string& what);
double parse_double(const std::string& text, const std::string& what);
bool parse_bool(const std::string& text, const std::string& what);

}  // namespace dlaunch
