#include "launcher/dlaunch_main.h"

#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <fmt/format.h>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/version.h"
#include "launcher/agent/agent.h"
#include "launcher/config/cli.h"
#include "launcher/config/completion.h"
#include "launcher/agent/early_signals.h"
#include "launcher/flash/flash_dir.h"
#include "launcher/flash/flash_persist.h"
#include "launcher/flash/flash_sweep.h"
#include "launcher/status/job_control.h"
#include "launcher/config/job_services.h"
#include "launcher/config/config_resolution.h"
#include "launcher/config/launch_config.h"
#include "launcher/process/posix_process_context.h"
#include "launcher/process/standard_fds.h"
#include "launcher/config/program_check.h"
#include "launcher/config/python_hooks.h"
#include "launcher/config/slurm_launch.h"
#include "rendezvous/tcp/job_token.h"

namespace {

// The job's flash directory (DLAUNCH_FLASH_DIR), made before any worker starts and gone after
// the agent, or by the orphan guard after a SIGKILL. None when --flash_limit is 0 or it cannot be
// made: workers then run as before (dtrain keeps disk checkpoints only).
dlaunch::FlashDir open_flash_dir(const dlaunch::LaunchConfig& cfg,
                                 dlaunch::PosixProcessContext& procs) {
  using namespace dlaunch;
  FlashDir flash;
  // Before making ours: the directories of jobs whose agent and guard were killed together
  // would otherwise hold their memory until reboot.
  sweep_stale_flash_dirs(kFlashBase);
  if (cfg.flash_limit <= 0) return flash;
  try {
    flash = FlashDir::create(kFlashBase, cfg.run_id, cfg.flash_limit, procs.guard_pid());
  } catch (const SystemError& e) {
    log_warning("{}; the workers get no DLAUNCH_FLASH_DIR", e.what());
    return flash;
  }
  if (!procs.remove_on_agent_death(flash.path())) {
    log_warning("the orphan guard cannot take the flash directory {}: it would be left behind if "
                "dlaunch were killed",
                flash.path());
  }
  log_info("flash directory {} ({}; --flash_limit {} MiB{})", flash.path(),
           flash.enforced() ? "a tmpfs of its own" : "a plain directory in " + std::string(kFlashBase),
           cfg.flash_limit >> 20,
           flash.enforced() ? "" : ", not enforced: dlaunch may not mount here");
  return flash;
}

// Parses and resolves the flags into `cfg`; an exit code when dlaunch is done already
// (--version, --help, a usage error).
std::optional<int> read_config(const std::vector<std::string>& args, dlaunch::LaunchConfig& cfg,
                               dlaunch::HostInfo& host) {
  using namespace dlaunch;
  try {
    CliArgs cli = parse_cli(args);
    if (cli.values.count("version")) {
      std::cout << version_text("dlaunch");
      return 0;
    }
    if (cli.help) {
      std::cout << help_text();
      return 0;
    }
    if (auto shell = cli.values.find("print_completion"); shell != cli.values.end()) {
      // torchrun 2.x's --print_completion SHELL; dlaunch generates bash's only.
      if (shell->second != "bash") {
        throw UsageError(fmt::format(
            "{}='{}' is not supported: dlaunch prints bash completion only; use {} bash",
            cli.spelled.at("print_completion"), shell->second, cli.spelled.at("print_completion")));
      }
      std::cout << bash_completion_script(flag_specs());
      return 0;
    }
    host = HostInfo::detect();
    cfg = resolve_config(cli, process_env(), host);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "dlaunch: error: %s\n", e.what());
    return exit_codes::kUsage;
  }
  return std::nullopt;
}

// What the agent gets from the job's services and this host.
dlaunch::AgentOptions agent_options(const dlaunch::LaunchConfig& cfg,
                                    const dlaunch::HostInfo& host,
                                    const dlaunch::JobServices& services) {
  using namespace dlaunch;
  AgentOptions opts;
  opts.host = host.hostname;
  opts.version = version_text("dlaunch");
  if (!opts.version.empty() && opts.version.back() == '\n') opts.version.pop_back();
  opts.rendezvous = services.rendezvous;
  opts.use_agent_store = services.use_agent_store;
  opts.store_proxy = cfg.wants_store_proxy() && services.use_agent_store;
  opts.hosts_store = services.server != nullptr;
  if (services.server && !services.rendezvous) {
    opts.master_addr = services.master_addr;
    opts.master_port = services.master_port;
  }
  opts.store_server = services.server;
  opts.status_endpoint = true;
  auto token_file = cfg.rdzv_conf.find("token_file");
  opts.job_token = load_job_token(token_file == cfg.rdzv_conf.end() ? "" : token_file->second);
  opts.base_env = current_environment();
  opts.cpus = host.cpus;
  opts.python_hooks_dir = python_hooks_dir();
  return opts;
}

// The job on this node: its store and rendezvous, the flash directory, the agent.
int run_agent(const dlaunch::LaunchConfig& cfg, const dlaunch::HostInfo& host) {
  using namespace dlaunch;
  try {
    boost::asio::io_context io;
    // The process context first: it forks the orphan guard while we are single-threaded (the
    // store server starts a thread).
    PosixProcessContext procs(io);
    JobServices services =
        start_job_services(cfg, host.hostname, std::string(version()) + "+" + git_commit());
    AgentOptions opts = agent_options(cfg, host, services);
    FlashDir flash = open_flash_dir(cfg, procs);
    opts.flash_dir = flash.path();
    int code;
    {
      Agent agent(cfg, procs, io, opts);
      code = agent.run();
    }
    // The newest training state may exist only in memory (a stop cut short, a failure): what
    // the workers asked to keep goes to disk before the directory goes.
    if (code != exit_codes::kSuccess) {
      for (const auto& path : persist_flash_state(flash.path())) {
        log_info("kept the workers' flash state {} on disk (it was only in memory; their "
                 "resume finds it)",
                 path);
      }
    }
    // The outcome is decided and the agent's handlers are gone (Asio restores the default
    // action). Slurm signals every process of a step at once, so a SIGTERM can land after the
    // workers already ended: it must not turn `code` (75 after a preemption notice) into death
    // by signal while the store server and the orphan guard shut down.
    for (int s : cfg.stop_signals) {
      if (s != SIGCHLD && s != SIGTSTP && s != SIGCONT) ::signal(s, SIG_IGN);
    }
    for (int s : {SIGUSR1, SIGUSR2}) ::signal(s, SIG_IGN);
    return code;
  } catch (const UsageError& e) {
    log_error("{}", e.what());
    return exit_codes::kUsage;
  } catch (const std::exception& e) {
    log_error("{}", e.what());
    return exit_codes::kWorkersFailed;
  }
}

}  // namespace

namespace dlaunch {

int dlaunch_main(int argc, char** argv) {
  open_missing_standard_fds();
  std::vector<std::string> args(argv + 1, argv + argc);
  // `dlaunch status|stop|restart|dump`: talk to a running job (job_control.h). A program of
  // one of these names runs as ./status or after `--`.
  if (!args.empty() && is_job_control_command(args[0])) return run_job_control(args);
  LaunchConfig cfg;
  HostInfo host;
  if (auto code = read_config(args, cfg, host)) return *code;
  // From here on the signals the agent handles have a handler (PID 1 of a container gets no
  // other); the agent's own take over before its first worker starts.
  handle_signals_before_the_agent(cfg.stop_signals);
  // A program that cannot run, or an etcd that cannot be found, fails every attempt the same
  // way: say so now, spend no restart (and --dry_run makes the same checks).
  for (auto problem : {check_program(cfg, current_program_check_env()),
                       rendezvous_endpoint_problem(cfg)}) {
    if (!problem) continue;
    std::fprintf(stderr, "dlaunch: error: %s\n", problem->c_str());
    return exit_codes::kUsage;
  }
  if (cfg.dry_run) {
    // Node 0's own name may resolve only once its host is up: the run waits for it.
    if (auto note = store_address_note(cfg)) {
      std::fprintf(stderr, "dlaunch: note: %s\n", note->c_str());
    }
    std::cout << cfg.describe();
    return 0;
  }
  if (cfg.slurm_mode == "task") {
    // One Slurm task per worker: no agent; become the worker (returns only by throwing).
    try {
      exec_slurm_task(cfg);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dlaunch: error: %s\n", e.what());
      return exit_codes::kUsage;
    }
  }
  return run_agent(cfg, host);
}

}  // namespace dlaunch
