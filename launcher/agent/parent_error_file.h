// When dlaunch itself runs under a launcher that gave it TORCHELASTIC_ERROR_FILE (torchrun,
// another dlaunch), the root cause is handed up as torchrun's agent does: the worker's error
// file as is, else a file in the same format saying how the worker ended.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "launcher/process/worker_group.h"

namespace dlaunch {

// Writes the file `base_env` names for the group's root cause; nothing when there is no such
// variable or no root cause. A write failure only logs.
void write_parent_error_file(const WorkerGroup& group,
                             const std::vector<std::pair<std::string, std::string>>& base_env,
                             const std::string& host, Duration hang_timeout);

}  // namespace dlaunch
