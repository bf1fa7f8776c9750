// The directory one run of dlaunch writes its per-rank files into (logs, error files,
// heartbeats, stacks): <log_dir>/<run_id>..., created here and owned by this run alone.
//
// Two jobs sharing a --log_dir, or a rerun into the same one, must never delete or mix into
// each other's files (both happened with a fixed <log_dir>/<run_id>: the default run id is
// "none" for every job). So, as torchrun 1.13 does (tempfile.mkdtemp(prefix=f"{run_id}_")), a
// run gets <log_dir>/<run_id>_<random>. A run id the user chose (--rdzv_id, its twins) keeps
// the predictable <log_dir>/<run_id> when that does not exist yet; when it does (an earlier
// run, or another node of the job sharing the file system), the run takes a fresh
// <run_id>_<random> and says so. Creation is an atomic mkdir, so two agents racing for the same
// name cannot both get it. TORCHELASTIC_RUN_ID is the run id either way, never the directory.
//
// Blocks on the file system only. Throws UsageError (exit 2: give a writable --log_dir) when
// the directory cannot be created.
#pragma once

#include <string>

#include "launcher/config/launch_config.h"

namespace dlaunch {

struct RunDir {
  std::string path;  // absolute
  std::string note;  // non-empty when the user's name was taken and another was picked: why
};

// `named_by_user`: the run id was chosen by the user, not a default or a random one.
RunDir create_run_dir(const std::string& log_dir, const std::string& run_id, bool named_by_user);

// Whether cfg's run id was chosen by the user (--rdzv_id, DLAUNCH_RDZV_ID, PET_RDZV_ID), not the
// default "none", --standalone's random id or one implied by a scheduler.
bool run_id_named_by_user(const LaunchConfig& cfg);

}  // namespace dlaunch
