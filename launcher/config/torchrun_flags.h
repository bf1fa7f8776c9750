// The flags torchrun 2.x added after 1.13, as dlaunch reads and applies them: the console
// prefix template, --duplicate_*_filters lists, --signals_to_handle, --virtual_local_rank's
// environment, and the values dlaunch refuses (--event_log_handler, --logs_specs,
// --numa_binding, --print_completion). Pure functions: tests need no process.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dlaunch {

// torchrun's --log_line_prefix_template, rendered as Python's string.Template.safe_substitute
// renders it: ${role_name}, ${rank}, ${local_rank}, ${hostname} (also without braces) become
// their values, "$$" becomes "$", any other '$' text stays as written.
struct PrefixMacros {
  std::string role_name;
  int64_t rank = 0;
  int64_t local_rank = 0;
  std::string hostname;
};
std::string render_log_line_prefix(const std::string& tmpl, const PrefixMacros& macros);

// torchrun's comma_separated_list: "a,b" -> {a, b}; ",," is a literal comma. "" -> {""}, which
// matches every line, as in torchrun.
std::vector<std::string> parse_filter_list(const std::string& text);
// Whether `line` contains any of `needles` (torchrun: `needle in line`).
bool line_matches(const std::string& line, const std::vector<std::string>& needles);

// --signals_to_handle "SIGTERM,SIGINT": the signal numbers, in order. Throws UsageError naming
// `what` for a name that is no signal, or one the agent cannot handle (SIGKILL, SIGSTOP) or
// must not (a fault such as SIGSEGV belongs to the process that caused it).
std::vector<int> parse_signal_list(const std::string& text, const std::string& what);

// --virtual_local_rank: LOCAL_RANK=0 and the worker's own device as device 0. `env` is the
// worker's environment, changed in place: CUDA_VISIBLE_DEVICES becomes the local_rank-th entry
// of the inherited list (HIP_VISIBLE_DEVICES's, which ROCm prefers, when that is set; then
// both are set), or the local rank itself when nothing was inherited.
void apply_virtual_local_rank(std::vector<std::pair<std::string, std::string>>& env,
                              int64_t local_rank);

// Sets `name` in `env`, replacing an inherited value.
void set_env(std::vector<std::pair<std::string, std::string>>& env, const std::string& name,
             const std::string& value);

// Refuses what dlaunch does not do, with a sentence (UsageError); `what` names the flag as the
// user spelled it. The defaults (null, default, unset) pass.
void check_event_log_handler(const std::string& value, const std::string& what);
void check_logs_specs(const std::string& value, const std::string& what);
void check_numa_binding(const std::string& value, const std::string& what);

}  // namespace dlaunch
