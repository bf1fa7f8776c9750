#include "launcher/config/config_resolution.h"

#include "launcher/process/exit_status.h"
#include "launcher/flash/flash_dir.h"
#include "launcher/config/kubernetes_env.h"
#include "launcher/config/torchrun_flags.h"

#include <dirent.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <random>
#include <set>
#include <string_view>

#include "common/env.h"
#include "common/error.h"
#include "launcher/slurm/slurm_env.h"
#include "launcher/config/slurm_launch.h"
#include "rendezvous/handlers/rendezvous_registry.h"


namespace dlaunch {
namespace {

// The backend of an elastic node range (--nnodes MIN:MAX) given no --rdzv_backend, and the one
// --standalone runs: torchrun's choices.
constexpr const char* kElasticDefaultBackend = "c10d";
constexpr const char* kStandaloneBackend = "static";

// The longest duration a flag of seconds takes.
constexpr double kMaxSeconds = 1e7;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return parts;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

// torchrun's environment twin for a flag it shares with dlaunch ("PET_NPROC_PER_NODE"), or "".
std::string torchrun_twin(const std::string& name) {
  static const std::set<std::string> kTorchrunFlags = {
      "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf",
      "standalone", "max_restarts", "monitor_interval", "start_method", "role", "module",
      "no_python", "log_dir", "redirects", "tee", "node_rank", "master_addr", "master_port",
      "local_addr", "local_ranks_filter", "use_env", "log_line_prefix_template",
      "duplicate_stdout_filters", "duplicate_stderr_filters", "event_log_handler",
      "signals_to_handle", "shutdown_timeout", "virtual_local_rank", "run_path"};
  if (!kTorchrunFlags.count(name)) return "";
  std::string env = "PET_";
  for (char c : name) env += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return env;
}

// The variable torchrun 2.x reads after the flag and its PET_ twin, or "".
std::string torchrun_fallback(const std::string& name) {
  if (name == "log_line_prefix_template") return "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE";
  if (name == "shutdown_timeout") return "TORCH_ELASTIC_SHUTDOWN_TIMEOUT";
  return "";
}

// One flag's raw text and where it came from (flag > DLAUNCH_ twin > PET_ twin > torchrun's
// fallback > a Kubernetes controller's variable (kubernetes_env.h) > default).
struct Raw {
  std::string text;
  std::string origin;  // "--flag", "DLAUNCH_FLAG", "PET_FLAG", a variable and its meaning, or
                       // "default"
  std::string what;    // how to name it in errors: "--nproc_per_node" or "DLAUNCH_NPROC_PER_NODE"
  bool given() const { return origin != "default"; }
};

class Resolver {
 public:
  Resolver(const CliArgs& cli, const EnvLookup& env, LaunchConfig& cfg)
      : cli_(cli), env_(env), cfg_(cfg) {}

  Raw raw(const std::string& name) {
    const FlagSpec& spec = flag_spec(name);
    Raw r;
    if (auto it = cli_.values.find(name); it != cli_.values.end()) {
      r = {it->second, cli_.spelled.at(name), cli_.spelled.at(name)};
    } else if (auto v = env_(spec.env)) {
      r = {*v, spec.env, spec.env};
    } else if (auto pet = torchrun_twin(name); !pet.empty() && env_(pet)) {
      // torchrun's own twins (PET_NPROC_PER_NODE...) keep torchrun job scripts working.
      r = {*env_(pet), pet, pet};
    } else if (auto var = torchrun_fallback(name); !var.empty() && env_(var)) {
      r = {*env_(var), var, var};
    } else if (auto pod = kubernetes_fallback(name, env_, cfg_.max_nodes)) {
      // read_job_flags reads --nnodes before --node_rank, so max_nodes is the job's here.
      r = {pod->text, pod->origin, pod->variable};
    } else {
      r = {spec.fallback, "default", "--" + name};
    }
    cfg_.origin[name] = r.origin;
    return r;
  }
  std::string str(const std::string& name) { return raw(name).text; }
  int64_t integer(const std::string& name, int64_t min, int64_t max) {
    Raw r = raw(name);
    int64_t v = parse_int(r.text, r.what);
    if (v < min || v > max) {
      throw UsageError(fmt::format("{}={} is out of range; allowed: {} to {}", r.what, v, min, max));
    }
    return v;
  }
  double seconds(const std::string& name, bool allow_zero) {
    Raw r = raw(name);
    double v = parse_double(r.text, r.what);
    // !(v <= kMaxSeconds) also refuses nan, which every comparison lets through.
    if (v < 0 || (!allow_zero && v == 0) || !(v <= kMaxSeconds)) {
      throw UsageError(fmt::format(
          "{}={} is not allowed; expected a number of seconds from {} to {:g} (about 115 days)",
          r.what, r.text, allow_zero ? "0" : "more than 0", kMaxSeconds));
    }
    return v;
  }
  bool boolean(const std::string& name) {
    Raw r = raw(name);
    // Kubeflow's PyTorchJob says standalone with PET_STANDALONE="" (set, empty); torchrun
    // itself fails on it (int('')). A switch's twin that is set but empty means on.
    if (r.text.empty() && r.origin.rfind("PET_", 0) == 0) return true;
    return parse_bool(r.text, r.what);
  }

 private:
  const CliArgs& cli_;
  const EnvLookup& env_;
  LaunchConfig& cfg_;
};

// The run id names directories (<log_dir>/<run_id>, $TMPDIR/dlaunch_<run_id>_*) and store keys:
// it must stay one path component.
void check_run_id(const Raw& r) {
  const std::string& id = r.text;
  std::string why;
  if (id.empty()) {
    why = "it is empty";
  } else if (id == "." || id == "..") {
    why = "it is a directory name ('" + id + "')";
  } else if (id.find('/') != std::string::npos) {
    why = "it contains '/'";
  } else {
    for (char c : id) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        why = fmt::format("it contains the control character 0x{:02x}", static_cast<int>(c));
        break;
      }
    }
  }
  if (why.empty()) return;
  std::string shown = id.size() > 80 ? id.substr(0, 80) + "..." : id;
  for (char& c : shown) c = static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? '?' : c;
  throw UsageError(fmt::format(
      "{}='{}' is not allowed: {}; expected a name such as job7 (letters, digits, '-', '_', "
      "'.'; no '/', no control characters), as it names this job's log directory",
      r.what, shown, why));
}

int64_t resolve_nproc(const Raw& r, const HostInfo& host) {
  if (r.text == "cpu") return host.cpus;
  if (r.text == "gpu") {
    if (host.gpus == 0) {
      throw UsageError(fmt::format(
          "{}=gpu but this node has no visible GPU; use a number, cpu, or auto (gpu if any, else "
          "cpu)",
          r.what));
    }
    return host.gpus;
  }
  if (r.text == "auto") return host.gpus > 0 ? host.gpus : host.cpus;
  int64_t n = 0;
  try {
    n = parse_int(r.text, r.what);
  } catch (const UsageError&) {
    throw UsageError(fmt::format(
        "{}='{}' is not allowed; expected a positive number, cpu, gpu or auto", r.what, r.text));
  }
  if (n < 1 || n > 4096) {
    throw UsageError(fmt::format("{}={} is out of range; allowed: 1 to 4096, cpu, gpu or auto",
                                 r.what, n));
  }
  return n;
}

void resolve_nnodes(const Raw& r, LaunchConfig& cfg) {
  auto parts = split(r.text, ':');
  auto bad = [&]() {
    return UsageError(fmt::format(
        "{}='{}' is not allowed; expected a node count N or a range MIN:MAX with 1 <= MIN <= MAX",
        r.what, r.text));
  };
  if (parts.size() > 2) throw bad();
  try {
    cfg.min_nodes = parse_int(parts[0], r.what);
    cfg.max_nodes = parts.size() == 2 ? parse_int(parts[1], r.what) : cfg.min_nodes;
  } catch (const UsageError&) {
    throw bad();
  }
  if (cfg.min_nodes < 1 || cfg.max_nodes < cfg.min_nodes) throw bad();
}

std::vector<int64_t> parse_rank_list(const Raw& r, int64_t nproc) {
  std::vector<int64_t> ranks;
  if (trim(r.text).empty()) return ranks;
  for (const auto& part : split(r.text, ',')) {
    int64_t v = 0;
    try {
      v = parse_int(trim(part), r.what);
    } catch (const UsageError&) {
      throw UsageError(fmt::format(
          "{}='{}' is not allowed; expected comma-separated local ranks such as 0,2", r.what,
          r.text));
    }
    if (v < 0 || v >= nproc) {
      throw UsageError(fmt::format(
          "{}='{}' names local rank {}, but local ranks are 0 to {} (--nproc_per_node={})", r.what,
          r.text, v, nproc - 1, nproc));
    }
    ranks.push_back(v);
  }
  return ranks;
}

void check_std_ranks(const StdSpec& spec, const Raw& r, int64_t nproc) {
  for (const auto& [rank, mask] : spec.by_rank) {
    if (rank >= nproc) {
      throw UsageError(fmt::format(
          "{}='{}' names local rank {}, but local ranks are 0 to {} (--nproc_per_node={})", r.what,
          r.text, rank, nproc - 1, nproc));
    }
  }
}

std::map<std::string, std::string> parse_rdzv_conf(const Raw& r) {
  std::map<std::string, std::string> conf;
  if (trim(r.text).empty()) return conf;
  for (const auto& part : split(r.text, ',')) {
    size_t eq = part.find('=');
    std::string key = eq == std::string::npos ? "" : trim(part.substr(0, eq));
    if (key.empty()) {
      throw UsageError(fmt::format(
          "{}='{}' is not allowed: '{}' is not key=value; expected key=value pairs separated by "
          "commas, such as join_timeout=60,last_call_timeout=1",
          r.what, r.text, part));
    }
    conf[key] = trim(part.substr(eq + 1));
  }
  return conf;
}

// Every key is checked before anything starts, whatever the backend (a single-node job creates
// no rendezvous, so nothing later would look): a typo must not silently fall back to a default.
void check_rdzv_conf(const std::map<std::string, std::string>& conf, const Raw& r) {
  // The keys every backend reads (RendezvousConfig::parse).
  const std::vector<std::string>& common_keys = RendezvousConfig::keys();
  // Keys torchrun's backends read that dlaunch has no use for: accepted so torchrun command
  // lines keep working, and ignored (the rendezvous logs that it ignores them). Accepted
  // whatever --rdzv_backend says: torchrun command lines carry them from one backend to another.
  const std::vector<std::string> ignored = ignored_rendezvous_conf_keys();
  const std::set<std::string> torchrun_only(ignored.begin(), ignored.end());
  std::map<std::string, std::string> ours;
  for (const auto& [key, value] : conf) {
    if (std::find(common_keys.begin(), common_keys.end(), key) != common_keys.end()) {
      ours[key] = value;
      continue;
    }
    if (torchrun_only.count(key)) continue;
    std::string guess = closest_match(key, common_keys);
    std::string known;
    for (const auto& k : common_keys) known += (known.empty() ? "" : ", ") + k;
    throw UsageError(
        fmt::format("{}='{}' has the unknown key '{}'{}; expected keys: {}", r.what, r.text, key,
                    guess.empty() ? "" : fmt::format(" (did you mean {}?)", guess), known));
  }
  try {
    RendezvousConfig::parse(ours);
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("{}='{}' is not allowed: {}", r.what, r.text, e.what()));
  }
}

// --dry_run and a real run agree: ports other nodes cannot learn, endpoints that are missing or
// malformed.
void check_endpoints(const LaunchConfig& cfg, const Raw& port) {
  if (cfg.slurm_mode == "task") {
    if (cfg.master_port == 0) {
      throw UsageError(
          "--master_port=0 cannot work with one Slurm task per worker: no agent runs to pick a "
          "port and tell the others; give a fixed --master_port or leave it unset (derived from "
          "SLURM_JOB_ID)");
    }
    return;
  }
  auto backend = cfg.backend();
  if (!backend->check_flags) return;
  BackendFlags flags = cfg.backend_flags();
  flags.master_port_what = port.what;
  backend->check_flags(flags);
}

// Node 0's store binds --master_port; the status endpoint could never bind it too.
void check_ports(const LaunchConfig& cfg) {
  const bool hosts_store = cfg.node_rank == 0 || cfg.max_nodes == 1;
  if (cfg.backend()->store_hosting == StoreHosting::kNodeRankZero && hosts_store &&
      cfg.status_port > 0 && cfg.status_port == cfg.master_port) {
    throw UsageError(fmt::format(
        "--status_port {} is also --master_port, where node 0 hosts the job's store; give "
        "--status_port another port (or 0 for a free one, -1 for none)",
        cfg.status_port));
  }
}

}  // namespace

StdSpec parse_std_spec(const std::string& text, const std::string& what) {
  auto bad = [&]() {
    return UsageError(fmt::format(
        "{}='{}' is not allowed; expected 0 (none), 1 (stdout), 2 (stderr), 3 (both), or "
        "per-local-rank pairs such as 0:1,1:2",
        what, text));
  };
  auto mask = [&](const std::string& s) {
    std::string t = trim(s);
    if (t.size() != 1 || t[0] < '0' || t[0] > '3') throw bad();
    return t[0] - '0';
  };
  StdSpec spec;
  if (text.find(':') == std::string::npos) {
    spec.all = mask(text);
    return spec;
  }
  for (const auto& part : split(text, ',')) {
    auto kv = split(part, ':');
    if (kv.size() != 2) throw bad();
    int64_t rank = 0;
    try {
      rank = parse_int(trim(kv[0]), what);
    } catch (const UsageError&) {
      throw bad();
    }
    if (rank < 0) throw bad();
    spec.by_rank[rank] = mask(kv[1]);
  }
  return spec;
}


namespace {

// The flags that later checks quote: what the user wrote and where it came from.
struct QuotedFlags {
  Raw nnodes, node_rank, port, backend, run_id, redirects, tee, ranks_filter;
};

// The nodes, the rendezvous and the restart policy.
void read_job_flags(Resolver& r, const HostInfo& host, LaunchConfig& cfg, QuotedFlags& q) {
  cfg.dry_run = r.boolean("dry_run");
  cfg.standalone = r.boolean("standalone");
  q.nnodes = r.raw("nnodes");
  resolve_nnodes(q.nnodes, cfg);
  cfg.nproc_per_node = resolve_nproc(r.raw("nproc_per_node"), host);
  q.node_rank = r.raw("node_rank");
  cfg.node_rank_given = q.node_rank.given();
  cfg.node_rank = r.integer("node_rank", 0, 1 << 20);
  Raw master_addr = r.raw("master_addr");
  if (master_addr.text.empty()) {
    throw UsageError(fmt::format(
        "{} is empty; expected node 0's address (a host name or IP, e.g. 10.0.0.1)",
        master_addr.what));
  }
  cfg.master_addr = master_addr.text;
  q.port = r.raw("master_port");
  cfg.master_port = r.integer("master_port", 0, 65535);
  q.backend = r.raw("rdzv_backend");
  cfg.rdzv_backend = q.backend.text;
  cfg.rdzv_endpoint = r.str("rdzv_endpoint");
  q.run_id = r.raw("rdzv_id");
  cfg.run_id = q.run_id.text;
  check_run_id(q.run_id);
  Raw rdzv_conf = r.raw("rdzv_conf");
  cfg.rdzv_conf = parse_rdzv_conf(rdzv_conf);
  check_rdzv_conf(cfg.rdzv_conf, rdzv_conf);
  Raw local_addr = r.raw("local_addr");
  cfg.local_addr = local_addr.text;
  cfg.host_name = host.hostname;
  if (!local_addr.given()) cfg.origin["local_addr"] = "default (this host's name)";
  cfg.max_restarts = r.integer("max_restarts", 0, 1 << 20);
  Raw restart_scope = r.raw("restart_scope");
  if (restart_scope.text != "rank" && restart_scope.text != "group") {
    throw UsageError(fmt::format(
        "{}='{}' is not a scope; expected rank (a failed worker that announced rank_recovery is "
        "replaced alone, the others go on) or group (every failure restarts the whole group)",
        restart_scope.what, restart_scope.text));
  }
  cfg.restart_scope = restart_scope.text;
  cfg.monitor_interval = r.seconds("monitor_interval", false);
  Raw start_method = r.raw("start_method");
  if (start_method.text != "spawn" && start_method.text != "fork" &&
      start_method.text != "forkserver") {
    throw UsageError(fmt::format("{}='{}' is not allowed; expected spawn, fork or forkserver",
                                 start_method.what, start_method.text));
  }
  cfg.start_method = start_method.text;
  Raw role = r.raw("role");
  if (role.text.empty() || role.text.find_first_of(" \t\n:") != std::string::npos) {
    throw UsageError(fmt::format(
        "{}='{}' is not allowed; expected a non-empty name without spaces or ':'", role.what,
        role.text));
  }
  cfg.role = role.text;
}

// torchrun 2.x's --shutdown_timeout sets --shutdown_grace; both at once must agree.
void read_shutdown_timeout(Resolver& r, LaunchConfig& cfg) {
  Raw grace = r.raw("shutdown_grace");
  Raw timeout = r.raw("shutdown_timeout");
  if (!timeout.given()) return;
  double seconds = r.seconds("shutdown_timeout", true);
  if (grace.given() && from_seconds(seconds) != cfg.shutdown_grace) {
    throw UsageError(fmt::format(
        "{}={} and {}={} were both given; they are the same setting (torchrun's name and "
        "dlaunch's), so give one",
        timeout.what, timeout.text, grace.what, grace.text));
  }
  cfg.shutdown_grace = from_seconds(seconds);
  cfg.origin["shutdown_grace"] = timeout.origin;
}

// --hang_timeout SECONDS, or auto[:STARTUP] (launcher/hang/hang_pace.h): learned from the
// workers' pace, with STARTUP seconds (default 300) until the pace is known.
void read_hang_timeout(Resolver& r, LaunchConfig& cfg) {
  const Raw raw = r.raw("hang_timeout");
  constexpr std::string_view kAuto = "auto";
  if (raw.text.compare(0, kAuto.size(), kAuto) != 0) {
    cfg.hang_timeout = from_seconds(r.seconds("hang_timeout", true));
    return;
  }
  cfg.hang_timeout_auto = true;
  cfg.hang_timeout = LaunchConfig::kHangAutoStartup;
  if (raw.text.size() == kAuto.size()) return;
  const std::string startup = raw.text.substr(kAuto.size() + 1);
  double v = -1;
  if (raw.text[kAuto.size()] == ':') {
    try {
      v = parse_double(startup, raw.what);
    } catch (const UsageError&) {
      v = -1;
    }
  }
  if (!(v > 0 && v <= kMaxSeconds)) {
    throw UsageError(fmt::format(
        "{}={} is not allowed; expected a number of seconds, 'auto' (the timeout learned from "
        "the workers' heartbeats), or 'auto:STARTUP' with STARTUP the seconds allowed until "
        "then (more than 0), e.g. auto:600",
        raw.what, raw.text));
  }
  cfg.hang_timeout = from_seconds(v);
}

// Supervision, the program and its output, Slurm.
void read_worker_flags(Resolver& r, LaunchConfig& cfg, QuotedFlags& q) {
  read_hang_timeout(r, cfg);
  cfg.hang_timeout_from_start = r.boolean("hang_timeout_from_start");
  cfg.no_python_hooks = r.boolean("no_python_hooks");
  cfg.log_fold = r.boolean("log_fold");
  cfg.log_timestamps = r.boolean("log_timestamps");
  cfg.shutdown_grace = from_seconds(r.seconds("shutdown_grace", true));
  read_shutdown_timeout(r, cfg);
  Raw signals = r.raw("signals_to_handle");
  cfg.stop_signals = parse_signal_list(signals.text, signals.what);
  cfg.signals_to_handle = signals.text;
  cfg.virtual_local_rank = r.boolean("virtual_local_rank");
  cfg.log_line_prefix_template = r.str("log_line_prefix_template");
  for (auto [name, filters] :
       {std::pair{"duplicate_stdout_filters", &cfg.duplicate_stdout_filters},
        std::pair{"duplicate_stderr_filters", &cfg.duplicate_stderr_filters}}) {
    // Given, even as "", the list is torchrun's: [""] matches every line.
    if (Raw raw = r.raw(name); raw.given()) *filters = parse_filter_list(raw.text);
  }
  Raw handler = r.raw("event_log_handler");
  check_event_log_handler(handler.text, handler.what);
  Raw logs_specs = r.raw("logs_specs");
  check_logs_specs(logs_specs.text, logs_specs.what);
  Raw numa = r.raw("numa_binding");
  check_numa_binding(numa.text, numa.what);
  cfg.status_port = r.integer("status_port", -1, 65535);
  cfg.status_addr = r.str("status_addr");
  Raw flash_limit = r.raw("flash_limit");
  cfg.flash_limit = parse_flash_limit(flash_limit.text, flash_limit.what, host_ram_bytes());
  cfg.module = r.boolean("module");
  cfg.no_python = r.boolean("no_python");
  Raw python = r.raw("python");
  if (python.text.empty()) {
    throw UsageError(fmt::format("{} is empty; expected an interpreter such as /usr/bin/python3",
                                 python.what));
  }
  cfg.python = python.text;
  cfg.append_local_rank = r.boolean("append_local_rank_arg");
  cfg.run_path = r.boolean("run_path");
  cfg.use_env = r.boolean("use_env");
  cfg.log_dir = r.str("log_dir");
  q.redirects = r.raw("redirects");
  cfg.redirects = parse_std_spec(q.redirects.text, q.redirects.what);
  q.tee = r.raw("tee");
  cfg.tee = parse_std_spec(q.tee.text, q.tee.what);
  q.ranks_filter = r.raw("local_ranks_filter");
  r.raw("help");
  cfg.slurm = r.boolean("slurm");
  cfg.no_slurm = r.boolean("no_slurm");
  Raw store_proxy = r.raw("store_proxy");
  if (store_proxy.text != "off" && store_proxy.text != "on" && store_proxy.text != "auto") {
    throw UsageError(fmt::format(
        "{}='{}' is not a mode; expected off, on (the workers reach the job's store through "
        "this node's agent) or auto (on from {} nodes)",
        store_proxy.what, store_proxy.text, kStoreProxyAutoNodes));
  }
  cfg.store_proxy = store_proxy.text;
  // Checked here, not only under Slurm: a typo must fail on the laptop too, not on the cluster.
  Raw slurm_mode = r.raw("slurm_mode");
  if (slurm_mode.text != "auto" && slurm_mode.text != "agent" && slurm_mode.text != "task") {
    throw UsageError(fmt::format(
        "{}='{}' is not a mode; expected auto, agent (one dlaunch per node) or task (one Slurm "
        "task per worker)",
        slurm_mode.what, slurm_mode.text));
  }
}

// Flags that exclude each other; an elastic node range picks c10d unless a backend was named.
void check_combinations(LaunchConfig& cfg, const QuotedFlags& q) {
  if (cfg.module && cfg.no_python) {
    throw UsageError(
        "--module and --no_python were both given; -m runs the program as a Python module, so "
        "drop one of them");
  }
  if (cfg.append_local_rank && cfg.use_env) {
    throw UsageError(
        "--append_local_rank_arg and --use_env were both given; --use_env means the script reads "
        "LOCAL_RANK from the environment, so drop --append_local_rank_arg");
  }
  if (auto why = declined_rendezvous_backend(cfg.rdzv_backend)) {
    throw UsageError(fmt::format("{}='{}' {}", q.backend.what, cfg.rdzv_backend, *why));
  }
  auto backend = find_rendezvous_backend(cfg.rdzv_backend);
  if (!backend) {
    std::vector<std::string> names = rendezvous_backend_names();
    std::string last = names.back();
    names.pop_back();
    throw UsageError(fmt::format("{}='{}' is not allowed; expected {}{}{}", q.backend.what,
                                 cfg.rdzv_backend, fmt::join(names, ", "),
                                 names.empty() ? "" : " or ", last));
  }
  if (cfg.min_nodes != cfg.max_nodes) {
    if (!q.backend.given()) {
      cfg.rdzv_backend = kElasticDefaultBackend;
      cfg.origin["rdzv_backend"] = q.nnodes.origin + " (a MIN:MAX range)";
      backend = cfg.backend();
    } else if (!backend->elastic) {
      throw UsageError(fmt::format(
          "{}='{}' asks for an elastic node range, which the {} backend cannot do; use "
          "--rdzv_backend {} or a fixed --nnodes",
          q.nnodes.what, q.nnodes.text, backend->name, kElasticDefaultBackend));
    }
  }
  if (backend->node_rank_required && cfg.node_rank >= cfg.max_nodes) {
    throw UsageError(fmt::format(
        "{}={} is not allowed with --nnodes={}; node ranks are 0 to {}{}", q.node_rank.what,
        cfg.node_rank, cfg.max_nodes, cfg.max_nodes - 1,
        q.nnodes.given() ? ""
                         : " (no --nnodes was given: set it, or PET_NNODES, to the job's node "
                           "count)"));
  }
}

// torchrun: --standalone picks the store and a fresh run id by itself. An explicit --rdzv_id is
// honoured (handy to find the log directory); an explicit port too.
void apply_standalone(LaunchConfig& cfg, const QuotedFlags& q, const HostInfo& host) {
  if (cfg.max_nodes != 1) {
    throw UsageError(fmt::format(
        "--standalone is a single-node job but {}='{}'; drop --standalone to run on several "
        "nodes",
        q.nnodes.what, q.nnodes.text));
  }
  if (!q.run_id.given()) {
    cfg.run_id = host.fresh_run_id.empty() ? random_run_id() : host.fresh_run_id;
    cfg.origin["rdzv_id"] = "--standalone (random)";
  }
  if (!q.port.given()) {
    cfg.master_port = 0;
    cfg.origin["master_port"] = "--standalone (free port)";
  }
  // A backend whose agent hosts the store (static, c10d) is what --standalone means on one
  // node; another (etcd) would be dropped.
  if (q.backend.given() &&
      find_rendezvous_backend(q.backend.text)->store_hosting == StoreHosting::kNone) {
    throw UsageError(fmt::format(
        "--standalone runs its own store on this node, but {}={} asks for another rendezvous; "
        "drop --standalone to use {}, or drop {}",
        q.backend.what, q.backend.text, q.backend.text, q.backend.what));
  }
  cfg.rdzv_backend = kStandaloneBackend;
  cfg.origin["rdzv_backend"] = "--standalone";
}

// torchrun 2.x: a one-node static job given no --master_port (nor a twin, nor Slurm's) and no
// --rdzv_endpoint runs its store on a free port under a fresh run id, so two such jobs on one
// host never collide on the default port. An explicit --rdzv_id is kept (torchrun replaces even
// that).
void apply_one_node_default_port(LaunchConfig& cfg, const HostInfo& host) {
  if (cfg.standalone || !cfg.backend()->one_node_without_rendezvous || cfg.max_nodes != 1 ||
      !cfg.rdzv_endpoint.empty() || cfg.slurm_mode == "task" ||
      cfg.origin["master_port"] != "default") {
    return;
  }
  cfg.master_port = 0;
  cfg.origin["master_port"] = "default (one node: a free port, as torchrun 2.x)";
  if (cfg.origin["rdzv_id"] == "default") {
    cfg.run_id = host.fresh_run_id.empty() ? random_run_id() : host.fresh_run_id;
    cfg.origin["rdzv_id"] = "default (one node: random, as torchrun 2.x)";
  }
}

// The flags torchrun 2.x added, where they meet others or the environment.
void check_torchrun2_flags(const LaunchConfig& cfg, const EnvLookup& env) {
  if (!cfg.log_line_prefix_template.empty() && cfg.log_fold) {
    throw UsageError(
        "--log_line_prefix_template and --log_fold were both given; a folded line's prefix "
        "names several ranks ([default0-7]:), which a per-rank template cannot, so drop one");
  }
  if (!cfg.virtual_local_rank) return;
  const char* name = "HIP_VISIBLE_DEVICES";
  auto visible = env(name);
  if (!visible || visible->empty()) {
    name = "CUDA_VISIBLE_DEVICES";
    visible = env(name);
  }
  if (!visible) return;  // worker N gets device N
  auto entries = split(*visible, ',');  // as torchrun splits it: no escapes
  if (static_cast<int64_t>(entries.size()) < cfg.nproc_per_node) {
    throw UsageError(fmt::format(
        "--virtual_local_rank gives each worker the entry of {} at its local rank, but "
        "{}='{}' has {} entries for --nproc_per_node={}; list a device per worker or start "
        "fewer workers",
        name, name, *visible, entries.size(), cfg.nproc_per_node));
  }
}

// The program, else dtrain beside dlaunch.
void resolve_program(const CliArgs& cli, const HostInfo& host, LaunchConfig& cfg) {
  cfg.program = cli.program;
  cfg.program_args = cli.program_args;
  if (!cfg.program.empty() || cli.help) return;
  if (cfg.module || host.default_program.empty()) {
    throw UsageError(fmt::format(
        "no program was given{}; expected `dlaunch [options] program [args...]` (see dlaunch "
        "--help)",
        cfg.module ? " after -m (a module name)"
                   : ", and dtrain, the default program, is not in dlaunch's directory"));
  }
  cfg.program = host.default_program;
  cfg.origin["program"] = "default (dtrain beside dlaunch)";
}

}  // namespace

LaunchConfig resolve_config(const CliArgs& cli, const EnvLookup& env, const HostInfo& host) {
  LaunchConfig cfg;
  Resolver r(cli, env, cfg);
  QuotedFlags q;
  read_job_flags(r, host, cfg, q);
  read_worker_flags(r, cfg, q);
  check_combinations(cfg, q);
  if (cfg.standalone) apply_standalone(cfg, q, host);
  // Slurm fills what the user left at its default (explicit flag > twin > SLURM_* > default).
  apply_slurm(cli, env, cfg);
  apply_one_node_default_port(cfg, host);
  check_torchrun2_flags(cfg, env);
  // Local ranks are checked against the final worker count (Slurm may have set it).
  cfg.local_ranks_filter = parse_rank_list(q.ranks_filter, cfg.nproc_per_node);
  check_std_ranks(cfg.redirects, q.redirects, cfg.nproc_per_node);
  check_std_ranks(cfg.tee, q.tee, cfg.nproc_per_node);
  check_endpoints(cfg, q.port);
  check_ports(cfg);
  resolve_program(cli, host, cfg);
  return cfg;
}

}  // namespace dlaunch