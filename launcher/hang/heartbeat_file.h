// A worker's heartbeat file, as the agent sees it. The agent creates the file before the worker
// starts with a sentinel modification time (kUnarmedTime, far in the past); any other time means
// the worker touched it. Comparing the file's time with the worker's start instead would miss a
// beat made in the first milliseconds: file times come from the kernel's coarse clock, up to a
// jiffy behind the agent's clock, so such a touch can look older than the start.
//
// Neither call blocks beyond one open(2)/utimensat(2)/stat(2); neither throws.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "common/clock.h"

namespace dlaunch {

// 1970-01-01T00:00:01Z: no touch can produce it (utimensat(NULL) and writes set "now").
inline constexpr long kUnarmedHeartbeatSeconds = 1;

// Creates `path` (or resets an existing one: empty, with the sentinel time). False, with errno
// set, when that failed: the worker is then judged by the file's time as it is.
bool arm_heartbeat_file(const std::string& path);

// When the worker last touched its heartbeat file, on the steady clock; nullopt while the file is
// missing or still carries the sentinel (the worker never beat).
std::optional<TimePoint> last_heartbeat(const std::string& path);

// Whether the worker announced that it can recover in process when a peer rank is replaced:
// the line "rank_recovery" anywhere in the file (common/rank_recovery.h writes it). Reads at
// most kHeartbeatFileReadLimit bytes; false when the file is missing or unreadable.
inline constexpr size_t kHeartbeatFileReadLimit = 4096;
bool announced_rank_recovery(const std::string& path);

}  // namespace dlaunch
