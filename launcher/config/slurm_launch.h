// The Slurm glue the launcher calls (the rules themselves are in slurm_env.h):
//   1. apply_slurm(): at the end of config resolution, fills every setting the user left at its
//      default (no flag, no DLAUNCH_* twin) from SLURM_*, and records the variable as the
//      setting's origin so --dry_run prints "nnodes = 2 <- SLURM_STEP_NUM_NODES".
//   2. exec_slurm_task(): in task-per-worker mode, replaces dlaunch with the program, the
//      torchrun contract set from SLURM_PROCID/SLURM_LOCALID/... (no agent runs).
//
// Flags (cli.cc): --slurm (fail unless SLURM_JOB_ID is set), --no_slurm (ignore SLURM_*),
// --slurm_mode auto|agent|task; twins DLAUNCH_SLURM, DLAUNCH_NO_SLURM, DLAUNCH_SLURM_MODE.
#pragma once

#include "launcher/config/cli.h"
#include "launcher/config/launch_config.h"

namespace dlaunch {

// Never blocks. Throws UsageError (see resolve_slurm_settings: --slurm outside Slurm, a bad
// --slurm_mode, the batch-script trap, malformed SLURM_* values). Sets cfg.slurm_mode to "off",
// "agent" or "task". --standalone turns Slurm values off (it means "this node only").
void apply_slurm(const CliArgs& cli, const EnvLookup& env, LaunchConfig& cfg);

// Task-per-worker mode: sets the contract in this process's environment and execs the program
// (cfg.worker_argv) in place of dlaunch. Returns only by throwing: UsageError when Slurm's task
// variables are missing or --master_port is 0 (no agent exists to pick and publish a port),
// SystemError when exec fails (the message names the program).
[[noreturn]] void exec_slurm_task(const LaunchConfig& cfg);

}  // namespace dlaunch
