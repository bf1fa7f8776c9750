// Resolves the launch configuration (launch_config.h) from the command line (cli.h), the
// DLAUNCH_* environment twins, torchrun's PET_* twins, Slurm's and Kubernetes' variables and
// defaults, in that order of precedence. Resolution is pure: the environment and host facts are
// passed in, so tests need no process state.
//
// Errors: resolve_config throws UsageError (one sentence: the flag or variable, the value, what
// is allowed); dlaunch exits 2 on it.
#pragma once

#include <string>

#include "launcher/config/cli.h"
#include "launcher/config/launch_config.h"

namespace dlaunch {

// Parses "3" or "0:1,1:2"; `what` names the flag in the error.
StdSpec parse_std_spec(const std::string& text, const std::string& what);

// Resolves and validates everything a run checks before it starts anything (a --dry_run checks
// exactly the same): values, combinations, --rdzv_conf keys and values, endpoints, ports that
// other nodes could not learn. `host` supplies cpu/gpu counts for --nproc_per_node
// cpu|gpu|auto, the host name and the default program.
LaunchConfig resolve_config(const CliArgs& cli, const EnvLookup& env, const HostInfo& host);

}  // namespace dlaunch
