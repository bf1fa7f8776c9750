// The validated launch configuration: every setting of a run, each remembering where it came from
// (for --dry_run), plus a few host facts (cores, GPUs). config_resolution.h builds it from the
// command line, the environment and the host.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "rendezvous/tcp/default_ports.h"

namespace dlaunch {

struct BackendFlags;       // rendezvous/handlers/rendezvous_registry.h
struct RendezvousBackend;  // ditto

// Which of a worker's streams go somewhere: torchrun's Std (0 none, 1 stdout, 2 stderr, 3 both),
// either one value for every local rank or a per-local-rank map ("0:1,1:2").
struct StdSpec {
  static constexpr int kOut = 1;
  static constexpr int kErr = 2;
  int all = 0;                 // used when by_rank is empty
  std::map<int64_t, int> by_rank;  // local rank -> mask; ranks not listed: 0

  int for_rank(int64_t local_rank) const;
  bool operator==(const StdSpec& o) const { return all == o.all && by_rank == o.by_rank; }
};

struct HostInfo {
  int64_t cpus = 1;  // cores this process may run on (sched_getaffinity)
  // NVIDIA devices visible: count_visible_devices(CUDA_VISIBLE_DEVICES) when it is set (see
  // slurm_env.h), else the entries of /proc/driver/nvidia/gpus.
  int64_t gpus = 0;
  std::string fresh_run_id;  // the run id --standalone uses (random in detect())
  std::string hostname;      // this node's name: the address it advertises without --local_addr
  // The program run when none is given: the dtrain binary beside dlaunch's own, "" when there
  // is none (then a missing program is a usage error).
  std::string default_program;
  static HostInfo detect();
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
// Reads the real environment.
EnvLookup process_env();

// --store_proxy auto turns the proxy on from this many nodes (the largest --nnodes). Chosen
// where direct connections start to cost the store host (nodes x workers connections, each
// with its handshake and its own small reads): not yet measured by the simulator, so auto
// stays a guess and off is the default (docs/cli.md).
inline constexpr int64_t kStoreProxyAutoNodes = 64;

struct LaunchConfig {
  // Nodes and workers.
  int64_t min_nodes = 1;
  int64_t max_nodes = 1;
  int64_t nproc_per_node = 1;
  int64_t node_rank = 0;
  bool node_rank_given = false;  // an explicit --node_rank (a hint for elastic rendezvous)
  // Store and rendezvous.
  std::string master_addr = "127.0.0.1";
  int64_t master_port = kDefaultMasterPort;  // 0: pick a free port
  bool standalone = false;
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string run_id = "none";
  std::map<std::string, std::string> rdzv_conf;
  std::string local_addr;  // empty: the host name (host_name below) is advertised
  std::string host_name;   // HostInfo::hostname, for describe()
  // Accepted for torchrun compatibility and otherwise unused; kept so --dry_run shows them.
  std::string start_method = "spawn";
  bool use_env = false;
  // Supervision.
  int64_t max_restarts = 0;
  // What a failed worker restarts: "rank" (only itself, in process, when it announced
  // rank_recovery: launcher/agent/rank_replacement.h; else the group) or "group" (always the
  // whole group, as torchrun does).
  std::string restart_scope = "rank";
  double monitor_interval = 5;
  std::string role = "default";
  Duration hang_timeout{0};  // zero: off; with hang_timeout_auto, the start-up timeout
  // --hang_timeout auto[:STARTUP]: the timeout is learned from the workers' pace
  // (launcher/hang/hang_pace.h); hang_timeout holds the start-up timeout that applies until then.
  bool hang_timeout_auto = false;
  // --hang_timeout auto's start-up timeout when the flag gives none (NVRx's
  // initial_rank_heartbeat_timeout plays this part).
  static constexpr Duration kHangAutoStartup = std::chrono::seconds(300);
  // A worker that never touched its heartbeat file counts as hung --hang_timeout after its
  // start. Off by default: a program that does not heartbeat (or has not reached its first
  // step) is not hung.
  bool hang_timeout_from_start = false;
  // Workers get no dlaunch sitecustomize (optimizer-step heartbeats, Python stacks on a hang).
  bool no_python_hooks = false;
  Duration shutdown_grace = std::chrono::seconds(5);  // also torchrun's --shutdown_timeout
  // Signals that stop the job (forwarded, then --shutdown_grace, then SIGKILL): torchrun 2.x's
  // --signals_to_handle. SIGUSR1/SIGUSR2/SIGTSTP/SIGCONT keep their own meaning either way; a
  // stop signal left out keeps its default action (it ends dlaunch; the workers die with it).
  std::vector<int> stop_signals;
  std::string signals_to_handle;  // as given; workers get it as TORCHELASTIC_SIGNALS_TO_HANDLE
  // The status endpoint (agent_monitor.h): -1 off, 0 a free port; empty address: --local_addr,
  // else loopback for one node and the host name for several.
  int64_t status_port = 0;
  std::string status_addr;
  // Bytes the job's flash directory may hold (flash_dir.h); 0: no flash directory.
  int64_t flash_limit = 0;
  // The program.
  bool module = false;
  bool no_python = false;
  bool append_local_rank = false;
  bool run_path = false;  // <python> -u program, whatever its name (torchrun's runpy.run_path)
  // Every worker gets LOCAL_RANK=0 and its own device as device 0 (torchrun_flags.h).
  bool virtual_local_rank = false;
  std::string python = "python3";
  std::string program;
  std::vector<std::string> program_args;
  // Output.
  std::string log_dir;  // empty: no per-rank files unless redirects/tee ask for them
  StdSpec redirects;
  StdSpec tee;
  std::vector<int64_t> local_ranks_filter;  // empty: every local rank on the console
  bool log_fold = false;        // identical lines of several ranks once: "[default0-7]:line"
  bool log_timestamps = false;  // console lines start with the time the agent got them
  // torchrun's console prefix template ("" : "[<role><local_rank>]:"), torchrun_flags.h.
  std::string log_line_prefix_template;
  // Teed lines containing any of these go to attempt_<n>/filtered_std{out,err}.log, prefixed;
  // empty: no such file.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  bool dry_run = false;
  // The workers' store traffic through a proxy in each agent: "off", "on" or "auto" (on from
  // kStoreProxyAutoNodes nodes); launcher/agent/node_store_proxy.h.
  std::string store_proxy = "off";
  // Under Slurm (slurm_launch.h): "off", "agent" (one dlaunch per node) or "task" (exec the
  // program as this Slurm task's worker).
  std::string slurm_mode = "off";
  bool slurm = false;     // --slurm: fail outside a Slurm job
  bool no_slurm = false;  // --no_slurm: SLURM_* ignored

  // Canonical flag name -> where its value came from: "--nproc-per-node", "DLAUNCH_ROLE",
  // "default", or "--standalone" for values it implies.
  std::map<std::string, std::string> origin;

  // The argv every worker runs. argv[0] is the program path as given (the process context
  // resolves it against PATH). In every later argument torchrun's macro ${local_rank} (also
  // spelled $local_rank) becomes the worker's local rank, as torchrun's macros.substitute does;
  // unlike torchrun, "$$" is passed on unchanged (torchrun makes it "$"), and so is any other
  // "$name". --append_local_rank_arg adds --local_rank=N before the program's arguments.
  std::vector<std::string> worker_argv(int64_t local_rank) const;
  bool runs_python() const;
  // Whether a local rank's stream (1 stdout, 2 stderr) goes to the console: the rank passes
  // --local_ranks_filter, and the stream is not redirected (-r), or is also teed (-t): as in
  // torchrun, tee wins over redirect (files and console).
  bool console_shows(int64_t local_rank, int stream) const;
  // --store_proxy on, or auto with at least kStoreProxyAutoNodes nodes.
  bool wants_store_proxy() const {
    return store_proxy == "on" || (store_proxy == "auto" && max_nodes >= kStoreProxyAutoNodes);
  }
  // The resolved configuration, one "name = value  (origin)" line per setting, for --dry_run.
  // The worker command is quoted as a shell would need it.
  std::string describe() const;
  // The descriptor of rdzv_backend (rendezvous_registry.h); resolve_config accepts only a
  // registered one. Throws UsageError for another.
  std::shared_ptr<const RendezvousBackend> backend() const;
  // The flags the backend checks and resolves its endpoint from.
  BackendFlags backend_flags() const;
};

// `text` quoted for a POSIX shell: unchanged when it holds only characters no shell treats
// specially (letters, digits, @%+=:,./_-), else in single quotes ('' for the empty string).
std::string shell_quote(const std::string& text);

// A random run id (16 hex digits) for --standalone.
std::string random_run_id();

}  // namespace dlaunch
