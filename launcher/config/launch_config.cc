#include "launcher/config/launch_config.h"

#include <dirent.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <random>
#include <string_view>

#include "common/env.h"
#include "common/error.h"
#include "launcher/process/exit_status.h"
#include "launcher/slurm/slurm_env.h"
#include "rendezvous/handlers/rendezvous_registry.h"

namespace dlaunch {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "${local_rank}" and "$local_rank" (not followed by a letter, digit or '_') -> the rank, as
// Python's string.Template.safe_substitute does for torchrun; "$$" and every other '$' stay.
std::string substitute_local_rank(const std::string& arg, int64_t local_rank) {
  static const std::string kBraced = "${local_rank}";
  static const std::string kBare = "$local_rank";
  if (arg.find('$') == std::string::npos) return arg;
  std::string out;
  std::string rank = std::to_string(local_rank);
  for (size_t i = 0; i < arg.size();) {
    if (arg[i] != '$') {
      out += arg[i++];
    } else if (arg.compare(i, 2, "$$") == 0) {
      out += "$$";  // kept: torchrun turns it into "$", which breaks shell and regex arguments
      i += 2;
    } else if (arg.compare(i, kBraced.size(), kBraced) == 0) {
      out += rank;
      i += kBraced.size();
    } else if (arg.compare(i, kBare.size(), kBare) == 0 &&
               (i + kBare.size() == arg.size() ||
                !(std::isalnum(static_cast<unsigned char>(arg[i + kBare.size()])) ||
                  arg[i + kBare.size()] == '_'))) {
      out += rank;
      i += kBare.size();
    } else {
      out += arg[i++];
    }
  }
  return out;
}

int64_t count_gpus() {
  if (auto visible = get_env("CUDA_VISIBLE_DEVICES")) return count_visible_devices(*visible);
  int64_t n = 0;
  if (DIR* d = opendir("/proc/driver/nvidia/gpus")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(d);
  }
  return n;
}

// What the agent's job services (job_services.cc) would refuse once started, refused here so a
}  // namespace

int StdSpec::for_rank(int64_t local_rank) const {
  if (by_rank.empty()) return all;
  auto it = by_rank.find(local_rank);
  return it == by_rank.end() ? 0 : it->second;
}

HostInfo HostInfo::detect() {
  HostInfo h;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    h.cpus = std::max(1, CPU_COUNT(&set));
  } else {
    h.cpus = std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
  }
  h.gpus = count_gpus();
  h.fresh_run_id = random_run_id();
  char name[256] = {0};
  h.hostname = gethostname(name, sizeof(name) - 1) == 0 ? name : "localhost";
  // dtrain is installed (and built) next to dlaunch: build/bin/, or the same bin/ directory.
  std::vector<char> self(4096);
  ssize_t n = readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (n > 0) {
    std::string dir(self.data(), static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    std::string dtrain = dir + "/dtrain";
    if (access(dtrain.c_str(), X_OK) == 0) h.default_program = dtrain;
  }
  return h;
}

EnvLookup process_env() {
  return [](const std::string& name) { return get_env(name.c_str()); };
}

std::string random_run_id() {
  std::random_device rd;
  std::uniform_int_distribution<uint64_t> dist;
  uint64_t v = dist(rd) ^ (static_cast<uint64_t>(getpid()) << 32);
  return fmt::format("{:016x}", v);
}

bool LaunchConfig::runs_python() const {
  if (run_path) return true;
  if (no_python) return false;
  return module || ends_with(program, ".py");
}

std::vector<std::string> LaunchConfig::worker_argv(int64_t local_rank) const {
  std::vector<std::string> argv;
  if (runs_python()) {
    argv = {python, "-u"};
    if (module && !run_path) argv.push_back("-m");
  }
  argv.push_back(program);
  // torch.distributed.launch put --local_rank before the script's own arguments.
  if (append_local_rank) argv.push_back(fmt::format("--local_rank={}", local_rank));
  argv.insert(argv.end(), program_args.begin(), program_args.end());
  // torchrun substitutes every argument of its entrypoint, not the entrypoint itself (the
  // interpreter, or the program under --no_python).
  for (size_t i = 1; i < argv.size(); ++i) argv[i] = substitute_local_rank(argv[i], local_rank);
  return argv;
}

bool LaunchConfig::console_shows(int64_t local_rank, int stream) const {
  bool shown = local_ranks_filter.empty() ||
               std::find(local_ranks_filter.begin(), local_ranks_filter.end(), local_rank) !=
                   local_ranks_filter.end();
  int bit = stream == 1 ? StdSpec::kOut : StdSpec::kErr;
  return shown && (!(redirects.for_rank(local_rank) & bit) || (tee.for_rank(local_rank) & bit));
}

std::string shell_quote(const std::string& text) {
  auto safe = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           std::string_view("@%+=:,./_-").find(c) != std::string_view::npos;
  };
  if (!text.empty() && std::all_of(text.begin(), text.end(), safe)) return text;
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

namespace {

using Rows = std::vector<std::pair<std::string, std::string>>;

std::string std_text(const StdSpec& s) {
  if (s.by_rank.empty()) return std::to_string(s.all);
  std::string t;
  for (const auto& [r, m] : s.by_rank) t += fmt::format("{}{}:{}", t.empty() ? "" : ",", r, m);
  return t;
}

std::string conf_text(const std::map<std::string, std::string>& conf) {
  std::string t;
  for (const auto& [k, v] : conf) t += fmt::format("{}{}={}", t.empty() ? "" : ",", k, v);
  return t;
}

std::string joined(const std::vector<int64_t>& ranks) {
  std::string t;
  for (auto r : ranks) t += fmt::format("{}{}", t.empty() ? "" : ",", r);
  return t;
}

std::string filter_text(const std::vector<std::string>& needles) {
  if (needles.empty()) return std::string("(none)");
  std::string t;
  for (const auto& n : needles) t += (t.empty() ? "'" : ",'") + n + "'";
  return t;
}

std::string signals_text(const std::vector<int>& signals) {
  std::string t;
  for (int sig : signals) t += (t.empty() ? "" : ",") + signal_name(sig);
  return t;
}

// The job's and the agent's settings, as --dry_run prints them.
Rows job_rows(const LaunchConfig& c) {
  return {
      {"nproc_per_node", std::to_string(c.nproc_per_node)},
      {"nnodes", c.min_nodes == c.max_nodes ? std::to_string(c.min_nodes)
                                            : fmt::format("{}:{}", c.min_nodes, c.max_nodes)},
      {"node_rank", std::to_string(c.node_rank)},
      {"master_addr", c.master_addr},
      {"master_port", c.master_port == 0 ? "0 (pick a free port)" : std::to_string(c.master_port)},
      {"standalone", c.standalone ? "true" : "false"},
      {"rdzv_backend", c.rdzv_backend},
      {"rdzv_endpoint", c.rdzv_endpoint},
      {"rdzv_id", c.run_id},
      {"rdzv_conf", conf_text(c.rdzv_conf)},
      {"local_addr",
       !c.local_addr.empty() ? c.local_addr
       : c.min_nodes == 1 && c.max_nodes == 1 && c.backend()->one_node_without_rendezvous
           ? c.host_name + " (unused: one node)"
           : c.host_name},
      {"max_restarts", std::to_string(c.max_restarts)},
      {"restart_scope", c.restart_scope},
      {"monitor_interval", fmt::format("{} (ignored)", c.monitor_interval)},
      {"start_method", c.start_method + " (ignored)"},
      {"use_env", c.use_env ? "true (ignored)" : "false"},
      {"role", c.role},
      {"hang_timeout",
       c.hang_timeout_auto
           ? fmt::format("auto (start-up timeout {})", to_seconds(c.hang_timeout))
       : to_seconds(c.hang_timeout) == 0 ? "0 (off)"
                                         : fmt::format("{}", to_seconds(c.hang_timeout))},
      {"hang_timeout_from_start", c.hang_timeout_from_start ? "true" : "false"},
      {"no_python_hooks", c.no_python_hooks ? "true" : "false"},
      {"shutdown_grace", fmt::format("{}", to_seconds(c.shutdown_grace))},
      {"status_port", c.status_port < 0    ? "-1 (off)"
                      : c.status_port == 0 ? "0 (a free port)"
                                           : std::to_string(c.status_port)},
      {"status_addr", c.status_addr.empty()
                          ? "(--local_addr, else loopback for one node, the host name for several)"
                          : c.status_addr},
      {"flash_limit",
       c.flash_limit == 0 ? "0 (no flash directory)" : fmt::format("{} MiB", c.flash_limit >> 20)},
  };
}

// How the workers run and where their output goes.
Rows worker_rows(const LaunchConfig& c) {
  return {
      {"module", c.module ? "true" : "false"},
      {"no_python", c.no_python ? "true" : "false"},
      {"python", c.python},
      {"append_local_rank_arg", c.append_local_rank ? "true" : "false"},
      {"log_dir", c.log_dir},
      {"redirects", std_text(c.redirects)},
      {"tee", std_text(c.tee)},
      {"local_ranks_filter", joined(c.local_ranks_filter)},
      {"log_fold", c.log_fold ? "true" : "false"},
      {"log_timestamps", c.log_timestamps ? "true" : "false"},
      {"log_line_prefix_template", c.log_line_prefix_template.empty()
                                       ? "[${role_name}${local_rank}]:"
                                       : c.log_line_prefix_template},
      {"duplicate_stdout_filters", filter_text(c.duplicate_stdout_filters)},
      {"duplicate_stderr_filters", filter_text(c.duplicate_stderr_filters)},
      {"signals_to_handle", signals_text(c.stop_signals)},
      {"virtual_local_rank", c.virtual_local_rank ? "true" : "false"},
      {"run_path", c.run_path ? "true" : "false"},
      {"slurm", c.slurm ? "true" : "false"},
      {"no_slurm", c.no_slurm ? "true" : "false"},
      {"slurm_mode", c.slurm_mode},
      {"store_proxy", c.store_proxy == "auto"
                          ? fmt::format("auto ({} from {} nodes)",
                                        c.wants_store_proxy() ? "on" : "off", kStoreProxyAutoNodes)
                          : c.store_proxy},
  };
}

}  // namespace

std::string LaunchConfig::describe() const {
  Rows rows = job_rows(*this);
  for (auto& row : worker_rows(*this)) rows.push_back(std::move(row));
  std::string out = "dlaunch configuration (value  <- origin):\n";
  for (const auto& [name, value] : rows) {
    auto it = origin.find(name);
    out += fmt::format("  {:<22} = {:<24} <- {}\n", name, value,
                       it == origin.end() ? "default" : it->second);
  }
  std::string cmd;
  for (const auto& a : worker_argv(0)) cmd += (cmd.empty() ? "" : " ") + shell_quote(a);
  out += fmt::format("  worker command (local rank 0): {}", cmd);
  if (auto it = origin.find("program"); it != origin.end()) out += "  <- " + it->second;
  out += "\n";
  return out;
}

std::shared_ptr<const RendezvousBackend> LaunchConfig::backend() const {
  auto b = find_rendezvous_backend(rdzv_backend);
  if (!b) {
    throw UsageError(fmt::format("--rdzv_backend '{}' is not registered; expected one of: {}",
                                 rdzv_backend, fmt::join(rendezvous_backend_names(), ", ")));
  }
  return b;
}

BackendFlags LaunchConfig::backend_flags() const {
  BackendFlags f;
  f.endpoint = rdzv_endpoint;
  f.master_addr = master_addr;
  f.master_port = master_port;
  f.min_nodes = min_nodes;
  f.max_nodes = max_nodes;
  f.node_rank = node_rank;
  f.node_rank_given = node_rank_given;
  return f;
}

}  // namespace dlaunch
