// The small duties of a worker toward its launcher (DESIGN.md §3, §4), besides the heartbeat
// (common/heartbeat.h, called every step):
//  - on a fatal error, leave PyTorch's JSON error record in TORCHELASTIC_ERROR_FILE so the agent
//    reports the root cause;
//  - pick the number of compute threads.
// Neither throws: a worker must not die because its error file cannot be written.
#pragma once

#include <string>

#include "common/worker_env.h"

namespace dlaunch::train {

// Writes {"message": {"message": "<type>: <what>", "extraInfo": {"py_callstack": ...,
// "timestamp": "<unix seconds>"}}}, the format torch.distributed.elastic's @record writes.
// Empty path: no-op. Returns false when the file could not be written.
bool write_error_file(const std::string& path, const std::string& type, const std::string& what);

// --threads when > 0, else OMP_NUM_THREADS when set, else max(1, cores / local_world_size).
int resolve_threads(int flag, const WorkerEnv& env);

}  // namespace dlaunch::train
