// The phases of a worker's start-up, each said at debug level with the milliseconds since main()
// began: a replacement rank's start-up is on its survivors' clock (docs/dtrain.md, "Rank-level
// recovery"), and these lines (with the log's wall-clock stamps, comparable with the agent's)
// show where that time goes (bench/chaos/recovery_breakdown.py reads them).
//
//   mark_startup_begin();                 // first thing in main()
//   log_startup_phase("joined the group");  // "start-up: joined the group at +123 ms"
//
// Thread-safe (log lines are whole); costs nothing beyond the log level check when not debug.
#pragma once

#include <string_view>

namespace dlaunch::train {

void mark_startup_begin();
void log_startup_phase(std::string_view phase);

}  // namespace dlaunch::train
