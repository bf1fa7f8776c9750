#include "launcher/config/torchrun_flags.h"

#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <cctype>

#include "common/error.h"

namespace dlaunch {
namespace {

bool identifier_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The value of a macro, or false for a name the template does not know (left as written).
bool macro_value(const std::string& name, const PrefixMacros& m, std::string& out) {
  if (name == "role_name") {
    out = m.role_name;
  } else if (name == "rank") {
    out = std::to_string(m.rank);
  } else if (name == "local_rank") {
    out = std::to_string(m.local_rank);
  } else if (name == "hostname") {
    out = m.hostname;
  } else {
    return false;
  }
  return true;
}

struct NamedSignal {
  const char* name;
  int number;
};

// Signals a launcher can catch and pass on. Faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
// SIGABRT, SIGSYS) are left out: they belong to the process that raised them.
constexpr NamedSignal kHandleable[] = {
    {"SIGHUP", SIGHUP},       {"SIGINT", SIGINT},       {"SIGQUIT", SIGQUIT},
    {"SIGTERM", SIGTERM},     {"SIGUSR1", SIGUSR1},     {"SIGUSR2", SIGUSR2},
    {"SIGALRM", SIGALRM},     {"SIGPIPE", SIGPIPE},     {"SIGXCPU", SIGXCPU},
    {"SIGXFSZ", SIGXFSZ},     {"SIGVTALRM", SIGVTALRM}, {"SIGPROF", SIGPROF},
    {"SIGPWR", SIGPWR},       {"SIGWINCH", SIGWINCH},   {"SIGURG", SIGURG},
    {"SIGTSTP", SIGTSTP},     {"SIGCONT", SIGCONT},     {"SIGCHLD", SIGCHLD},
    {"SIGTTIN", SIGTTIN},     {"SIGTTOU", SIGTTOU},
};

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

}  // namespace

std::string render_log_line_prefix(const std::string& tmpl, const PrefixMacros& macros) {
  std::string out;
  std::string value;
  for (size_t i = 0; i < tmpl.size();) {
    if (tmpl[i] != '$' || i + 1 == tmpl.size()) {
      out += tmpl[i++];
      continue;
    }
    char next = tmpl[i + 1];
    if (next == '$') {
      out += '$';
      i += 2;
    } else if (next == '{') {
      size_t close = tmpl.find('}', i + 2);
      std::string name =
          close == std::string::npos ? "" : tmpl.substr(i + 2, close - i - 2);
      bool is_identifier = !name.empty() && identifier_start(name[0]) &&
                           std::all_of(name.begin(), name.end(), identifier_char);
      if (is_identifier && macro_value(name, macros, value)) {
        out += value;
        i = close + 1;
      } else {
        out += tmpl[i++];
      }
    } else if (identifier_start(next)) {
      size_t end = i + 1;
      while (end < tmpl.size() && identifier_char(tmpl[end])) ++end;
      if (macro_value(tmpl.substr(i + 1, end - i - 1), macros, value)) {
        out += value;
        i = end;
      } else {
        out += tmpl[i++];
      }
    } else {
      out += tmpl[i++];
    }
  }
  return out;
}

std::vector<std::string> parse_filter_list(const std::string& text) {
  std::vector<std::string> items(1);
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      items.back() += text[i];
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      items.back() += ',';
      ++i;
    } else {
      items.emplace_back();
    }
  }
  return items;
}

bool line_matches(const std::string& line, const std::vector<std::string>& needles) {
  return std::any_of(needles.begin(), needles.end(), [&](const std::string& needle) {
    return line.find(needle) != std::string::npos;
  });
}

std::vector<int> parse_signal_list(const std::string& text, const std::string& what) {
  std::vector<int> signals;
  for (const auto& part : parse_filter_list(text)) {
    std::string name = trim(part);
    if (name.empty()) continue;
    if (name == "SIGKILL" || name == "SIGSTOP") {
      throw UsageError(fmt::format(
          "{}='{}' names {}, which no process can catch; list signals such as "
          "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
          what, text, name));
    }
    auto it = std::find_if(std::begin(kHandleable), std::end(kHandleable),
                           [&](const NamedSignal& s) { return name == s.name; });
    if (it == std::end(kHandleable)) {
      throw UsageError(fmt::format(
          "{}='{}' names '{}', which is not a signal dlaunch can handle; expected names such as "
          "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2 (with the SIG prefix; faults such as "
          "SIGSEGV belong to the process that raised them)",
          what, text, name));
    }
    if (std::find(signals.begin(), signals.end(), it->number) == signals.end()) {
      signals.push_back(it->number);
    }
  }
  return signals;
}

void set_env(std::vector<std::pair<std::string, std::string>>& env, const std::string& name,
             const std::string& value) {
  auto it = std::find_if(env.begin(), env.end(), [&](const auto& kv) { return kv.first == name; });
  if (it == env.end()) {
    env.emplace_back(name, value);
  } else {
    it->second = value;
  }
}

void apply_virtual_local_rank(std::vector<std::pair<std::string, std::string>>& env,
                              int64_t local_rank) {
  auto find = [&](const char* name) {
    return std::find_if(env.begin(), env.end(), [&](const auto& kv) { return kv.first == name; });
  };
  auto set = [&](const char* name, const std::string& value) { set_env(env, name, value); };
  set("LOCAL_RANK", "0");
  auto hip = find("HIP_VISIBLE_DEVICES");
  bool from_hip = hip != env.end() && !hip->second.empty();
  auto parent = from_hip ? hip : find("CUDA_VISIBLE_DEVICES");
  std::string device = std::to_string(local_rank);
  if (parent != env.end()) {
    // resolve_config checked that the list has an entry for every local rank.
    std::vector<std::string> entries(1);  // torchrun's str.split(","): no escapes
    for (char c : parent->second) {
      if (c == ',') {
        entries.emplace_back();
      } else {
        entries.back() += c;
      }
    }
    if (local_rank < static_cast<int64_t>(entries.size())) {
      std::string entry = entries[static_cast<size_t>(local_rank)];
      size_t b = entry.find_first_not_of(" \t");
      size_t e = entry.find_last_not_of(" \t");
      device = b == std::string::npos ? "" : entry.substr(b, e - b + 1);
    }
  }
  set("CUDA_VISIBLE_DEVICES", device);
  if (from_hip) set("HIP_VISIBLE_DEVICES", device);
}

void check_event_log_handler(const std::string& value, const std::string& what) {
  if (value == "null") return;
  throw UsageError(fmt::format(
      "{}='{}' is not supported: dlaunch has no torchelastic event handlers, it records every "
      "event in the run directory's events.jsonl (dlaunch status --events shows them); drop the "
      "flag or give its default, null",
      what, value));
}

void check_logs_specs(const std::string& value, const std::string& what) {
  if (value.empty() || value == "default") return;
  throw UsageError(fmt::format(
      "{}='{}' is not supported: dlaunch loads no torchrun.logs_specs plugins, its log layout "
      "is torchrun's default one (--log_dir, -r, -t); drop the flag or give its default, "
      "default",
      what, value));
}

void check_numa_binding(const std::string& value, const std::string& what) {
  if (value.empty()) return;
  if (value != "node" && value != "socket" && value != "exclusive" && value != "core-complex") {
    throw UsageError(fmt::format(
        "{}='{}' is not a torchrun binding mode (node, socket, exclusive, core-complex); and "
        "dlaunch does not bind workers to NUMA nodes: drop the flag",
        what, value));
  }
  throw UsageError(fmt::format(
      "{}={} is not supported: dlaunch does not bind workers to the CPUs near their GPU; drop "
      "the flag, or bind each worker yourself (numactl --cpunodebind=N in a wrapper script run "
      "with --no_python)",
      what, value));
}

}  // namespace dlaunch
