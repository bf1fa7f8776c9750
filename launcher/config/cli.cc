#include "launcher/config/cli.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <optional>

#include "common/error.h"
#include "common/suggest.h"
#include "rendezvous/handlers/rendezvous_registry.h"
#include "rendezvous/tcp/default_ports.h"

namespace dlaunch {
namespace {

FlagSpec flag(std::string name, char short_name, bool takes_value, std::string fallback,
              std::string metavar, std::string help) {
  std::string env = "DLAUNCH_";
  for (char c : name) env += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return FlagSpec{std::move(name), short_name, takes_value, std::move(env),
                  std::move(fallback), std::move(metavar), std::move(help)};
}

std::vector<FlagSpec> make_specs() {
  return {
      flag("nproc_per_node", 0, true, "1", "N|cpu|gpu|auto",
           "workers on this node: a number, cpu (usable cores), gpu (visible GPUs), auto (gpu if "
           "any, else cpu)"),
      flag("nnodes", 0, true, "1", "N|MIN:MAX", "number of nodes, or an elastic range"),
      flag("node_rank", 0, true, "0", "K", "this node's rank (static rendezvous)"),
      flag("master_addr", 0, true, "127.0.0.1", "HOST", "address of node 0 (hosts the store)"),
      flag("master_port", 0, true, std::to_string(kDefaultMasterPort), "PORT",
           "port of the job's store; 0 picks a free one, as does a one-node job given no port "
           "(torchrun 2.x)"),
      flag("standalone", 0, false, "false", "",
           "single-node job with its own store on a free port and a random run id"),
      flag("rdzv_backend", 0, true, "static",
           fmt::format("{}", fmt::join(rendezvous_backend_names(), "|")),
           "rendezvous backend (c10d is the default for --nnodes MIN:MAX)"),
      flag("rdzv_endpoint", 0, true, "", "HOST:PORT", "rendezvous endpoint ([v6]:port works)"),
      flag("rdzv_id", 0, true, "none", "ID", "the job's run id (TORCHELASTIC_RUN_ID)"),
      flag("rdzv_conf", 0, true, "", "K=V,...",
           "rendezvous options: join_timeout, last_call_timeout, keep_alive_interval, "
           "keep_alive_max_attempt, close_timeout, ..."),
      flag("local_addr", 0, true, "", "ADDR", "address this node advertises to the others"),
      flag("max_restarts", 0, true, "0", "N", "group restarts allowed after failures"),
      flag("restart_scope", 0, true, "rank", "rank|group",
           "rank: a failed worker that announced rank_recovery (dtrain does) is replaced alone "
           "while the others go on, one restart each; group: every failure restarts the whole "
           "group"),
      flag("monitor_interval", 0, true, "0.1", "SECONDS",
           "accepted for torchrun compatibility; dlaunch sees exits as events, not by polling"),
      flag("start_method", 0, true, "spawn", "spawn|fork|forkserver",
           "accepted for torchrun compatibility; workers are always fresh processes"),
      flag("role", 0, true, "default", "NAME", "the workers' role (ROLE_NAME, log prefix)"),
      flag("module", 'm', false, "false", "", "run the program as a Python module (python -m)"),
      flag("no_python", 0, false, "false", "", "run the program directly, never under python"),
      flag("python", 0, true, "python3", "PATH",
           "interpreter for .py programs and -m (Debian's torch lives in /usr/bin/python3)"),
      flag("run_path", 0, false, "false", "",
           "run the program under <python> -u even without .py (torchrun's runpy.run_path; wins "
           "over --no_python and -m)"),
      flag("append_local_rank_arg", 0, false, "false", "",
           "append --local_rank=N to the program's arguments, for torch.distributed.launch "
           "scripts"),
      flag("use_env", 0, false, "false", "",
           "accepted for torch.distributed.launch compatibility (the rank is always in the env)"),
      flag("log_dir", 0, true, "", "DIR",
           "write each worker's stdout/stderr to DIR/<run_id>_<random>/attempt_<n>/<local_rank>/ "
           "(DIR/<run_id>/... for a run id you chose; a run never reuses another's directory)"),
      flag("redirects", 'r', true, "0", "0|1|2|3|R:S,...",
           "send stdout (1), stderr (2) or both (3) to the log files only; per local rank as "
           "0:1,1:2"),
      flag("tee", 't', true, "0", "0|1|2|3|R:S,...",
           "copy stdout (1), stderr (2) or both (3) to the log files and the console"),
      flag("local_ranks_filter", 0, true, "", "R,R,...",
           "show only these local ranks' output on the console (files get everything)"),
      flag("log_line_prefix_template", 0, true, "", "TEMPLATE",
           "the console prefix of each worker line instead of [${role_name}${local_rank}]:, with "
           "the macros ${role_name}, ${rank}, ${local_rank} and ${hostname} (also read from "
           "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)"),
      flag("duplicate_stdout_filters", 0, true, "", "TEXT,TEXT,...",
           "copy the teed (-t) stdout lines that contain any TEXT, prefixed, to "
           "attempt_<n>/filtered_stdout.log in the run directory (',,' is a comma)"),
      flag("duplicate_stderr_filters", 0, true, "", "TEXT,TEXT,...",
           "the same for stderr: attempt_<n>/filtered_stderr.log"),
      flag("log_fold", 0, false, "false", "",
           "print consecutive identical console lines of several ranks once, as "
           "[default0-7]:line (files get every line)"),
      flag("log_timestamps", 0, false, "false", "",
           "start each console line of the workers with the time dlaunch got it"),
      flag("hang_timeout", 0, true, "0", "SECONDS|auto|auto:STARTUP",
           "declare a worker hung when its heartbeat file is older than this; 0 = off; auto: "
           "max(1 s, 5 x the longest gap between heartbeats seen), STARTUP seconds (300) until "
           "that is known"),
      flag("hang_timeout_from_start", 0, false, "false", "",
           "with --hang_timeout: also a worker that never heartbeats is hung that long after its "
           "start (by default the clock starts at its first heartbeat)"),
      flag("no_python_hooks", 0, false, "false", "",
           "do not put dlaunch's sitecustomize on the workers' PYTHONPATH (it heartbeats on "
           "every torch optimizer step and dumps Python stacks of hung workers)"),
      flag("shutdown_grace", 0, true, "5", "SECONDS",
           "time between SIGTERM and SIGKILL when stopping workers"),
      flag("shutdown_timeout", 0, true, "", "SECONDS",
           "torchrun's name for --shutdown_grace (also read from TORCH_ELASTIC_SHUTDOWN_TIMEOUT); "
           "dlaunch's default stays 5, not torchrun's 30"),
      flag("signals_to_handle", 0, true, "SIGTERM,SIGINT,SIGHUP,SIGQUIT", "SIG,SIG,...",
           "the signals that stop the job: forwarded to every worker, which get --shutdown_grace "
           "before SIGKILL (SIGUSR1, SIGUSR2, SIGTSTP and SIGCONT are always handled as "
           "docs/cli.md says)"),
      flag("virtual_local_rank", 0, false, "false", "",
           "every worker gets LOCAL_RANK=0 and only its own GPU, as device 0 "
           "(CUDA_VISIBLE_DEVICES = the local rank's entry of the inherited list)"),
      flag("status_port", 0, true, "0", "PORT",
           "serve GET /status, /metrics and the control endpoints (dlaunch status|stop|restart|"
           "dump) here; 0 picks a free port, -1 serves nothing"),
      flag("status_addr", 0, true, "", "ADDR",
           "address the status endpoint binds (default: --local_addr, else 127.0.0.1 for one "
           "node, this host's name for several); 0.0.0.0 serves every interface"),
      flag("flash_limit", 0, true, "25%", "SIZE|P%|0",
           "size limit of the job's flash directory (DLAUNCH_FLASH_DIR, a tmpfs): bytes with "
           "K/M/G suffix, a percentage of RAM, or 0 for none"),
      flag("event_log_handler", 0, true, "null", "null",
           "accepted for torchrun compatibility with its default only: dlaunch writes its events "
           "to the run directory's events.jsonl"),
      flag("logs_specs", 0, true, "default", "default",
           "accepted for torchrun compatibility with its default only: no logs_specs plugins"),
      flag("numa_binding", 0, true, "", "MODE",
           "refused: dlaunch does not bind workers to NUMA nodes (torchrun 2.x's node, socket, "
           "exclusive, core-complex)"),
      flag("print_completion", 0, true, "", "bash",
           "print dlaunch's bash completion script and exit (zsh and tcsh are refused)"),
      flag("store_proxy", 0, true, "off", "off|on|auto",
           "on: this node's workers reach the job's store through a proxy in the agent, one "
           "connection per node (MASTER_ADDR/MASTER_PORT name the proxy); auto: on from "
           "64 nodes (--nnodes' maximum)"),
      flag("dry_run", 0, false, "false", "",
           "print the resolved configuration and where each value came from; start nothing"),
      // Slurm (launcher/config/slurm_launch.h, docs/slurm.md).
      flag("slurm", 0, false, "false", "",
           "require Slurm: take nnodes, node_rank, master_addr/port, rdzv_id and GPUs from "
           "SLURM_* (done anyway when SLURM_JOB_ID is set) and fail outside a Slurm job"),
      flag("no_slurm", 0, false, "false", "", "ignore every SLURM_* variable"),
      flag("slurm_mode", 0, true, "auto", "auto|agent|task",
           "under srun: agent = one dlaunch per node starts the workers; task = one Slurm task "
           "per worker, dlaunch sets RANK etc. and execs the program; auto = task when the step "
           "has more tasks than nodes"),
      flag("help", 'h', false, "false", "", "show this help"),
      flag("version", 0, false, "false", "", "print the version, the git commit and the build type, then exit"),
  };
}

std::string normalize(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

// Exact name, else a unique prefix (argparse's allow_abbrev), else UsageError.
const FlagSpec& find_long(const std::string& spelled, const std::string& name) {
  const auto& specs = flag_specs();
  for (const auto& s : specs) {
    if (s.name == name) return s;
  }
  std::vector<const FlagSpec*> matches;
  for (const auto& s : specs) {
    if (!name.empty() && s.name.compare(0, name.size(), name) == 0) matches.push_back(&s);
  }
  if (matches.size() == 1) return *matches.front();
  if (matches.size() > 1) {
    std::string names;
    for (const auto* m : matches) names += (names.empty() ? "--" : ", --") + m->name;
    throw UsageError(fmt::format("flag '{}' is ambiguous: it could be {}; spell it out",
                                 spelled, names));
  }
  std::vector<std::string> names;
  for (const auto& s : specs) names.push_back(s.name);
  std::string guess = closest_match(name, names);
  throw UsageError(
      fmt::format("flag '{}' is not a dlaunch flag{}; put dlaunch flags before the program and see "
                  "'dlaunch --help' for the list",
                  spelled, guess.empty() ? "" : fmt::format(" (did you mean --{}?)", guess)));
}

const FlagSpec& find_short(char c, const std::string& spelled) {
  for (const auto& s : flag_specs()) {
    if (s.short_name == c) return s;
  }
  throw UsageError(fmt::format(
      "flag '{}' is not a dlaunch flag; the short flags are -r, -t, -m and -h (see 'dlaunch "
      "--help')",
      spelled));
}


}  // namespace

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  return closest_word(word, candidates, normalize);
}

const std::vector<FlagSpec>& flag_specs() {
  static const std::vector<FlagSpec> specs = make_specs();
  return specs;
}

const FlagSpec& flag_spec(const std::string& name) {
  for (const auto& s : flag_specs()) {
    if (s.name == name) return s;
  }
  DL_CHECK(false) << "unknown flag name " << name;
  throw InternalError("unreachable");
}

CliArgs parse_cli(const std::vector<std::string>& args) {
  CliArgs out;
  size_t i = 0;
  auto record = [&](const FlagSpec& spec, const std::string& spelled,
                    const std::optional<std::string>& attached) {
    std::string value;
    if (spec.takes_value) {
      if (attached) {
        value = *attached;
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        throw UsageError(fmt::format("flag '{}' needs a value ({}); none was given", spelled,
                                     spec.metavar));
      }
    } else {
      value = attached ? *attached : "true";
    }
    out.values[spec.name] = value;
    out.spelled[spec.name] = spelled;
    if (spec.name == "help") out.help = true;
  };

  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.size() < 2 || a[0] != '-') break;  // the program
    if (a[1] == '-') {
      std::string body = a.substr(2);
      std::optional<std::string> attached;
      size_t eq = body.find('=');
      std::string spelled = a;
      if (eq != std::string::npos) {
        attached = body.substr(eq + 1);
        body = body.substr(0, eq);
        spelled = "--" + body;
      }
      record(find_long(spelled, normalize(body)), spelled, attached);
    } else {
      // -r3, -r=3, -r 3, -m, -h
      std::string spelled = a.substr(0, 2);
      const FlagSpec& spec = find_short(a[1], spelled);
      std::optional<std::string> attached;
      if (a.size() > 2) {
        if (!spec.takes_value && a[2] != '=') {
          throw UsageError(fmt::format(
              "flag '{}' takes no value but was given as '{}'; write it on its own", spelled, a));
        }
        attached = a.substr(a[2] == '=' ? 3 : 2);
      }
      record(spec, spelled, attached);
    }
  }
  if (i < args.size()) {
    out.program = args[i];
    out.program_args.assign(args.begin() + static_cast<long>(i) + 1, args.end());
  }
  return out;
}

std::string help_text() {
  std::string text =
      // GNU's "Usage: ... / or: ..." lines, one each, which help2man turns into the synopsis.
      "Usage: dlaunch [options] [program [args...]]\n"
      "  or:  dlaunch status|stop|restart|dump [--rdzv_endpoint H:P | --master_addr H "
      "--master_port P] --rdzv_id ID [--json] [--events]\n"
      "(the second form talks to a running job: monitoring.md in dlaunch's docs)\n"
      "\n"
      "Starts --nproc_per_node workers running `program` with torchrun's environment contract,\n"
      "supervises them (restarts, hang detection, no orphans) and reports the first failure.\n"
      "A program ending in .py runs under `<python> -u`; -m runs `<python> -u -m program`.\n"
      "Without a program, dlaunch runs dtrain (the bundled trainer, from dlaunch's own\n"
      "directory) with its defaults; to give dtrain arguments, name it: dlaunch ... dtrain-path\n"
      "--epochs 5. In the program's arguments, ${local_rank} becomes each worker's local rank.\n"
      "\n"
      "Every flag accepts both spellings (--nproc_per_node, --nproc-per-node), --flag=value and\n"
      "--flag value, and is also read from its environment twin (flag > twin > default).\n"
      "\n"
      "options:\n";
  for (const auto& s : flag_specs()) {
    std::string left = "  ";
    if (s.short_name) left += fmt::format("-{}, ", s.short_name);
    left += "--" + s.name;
    if (s.takes_value) left += " " + s.metavar;
    text += fmt::format("{}\n      {}", left, s.help);
    if (s.name != "help" && s.name != "version" && s.name != "print_completion") {
      text += fmt::format(" [{}", s.env);
      if (!s.fallback.empty() && s.fallback != "false") text += fmt::format(", default {}", s.fallback);
      text += "]";
    }
    text += "\n";
  }
  text +=
      "\n"
      "exit codes (retry: whether starting the node again can help):\n"
      "  0        success\n"
      "  1        workers failed past --max_restarts, a node or the store was lost, the\n"
      "           rendezvous timed out (retry)\n"
      "  2        bad usage: a flag, a value, a program that cannot be run (do not retry)\n"
      "  75       stopped after a preemption notice (SIGUSR1): requeue, not a failure\n"
      "  78       the nodes' settings disagree (--nnodes, run id, node rank) (do not retry)\n"
      "  128+N    dlaunch was stopped by signal N (143: SIGTERM, a deleted pod)\n"
      "See docs/cli.md, docs/env.md and docs/troubleshooting.md.\n";
  return text;
}

}  // namespace dlaunch
