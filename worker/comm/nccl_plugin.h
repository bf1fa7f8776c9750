// The C interface between dtrain and its NCCL process-group plugin, libdlaunch_nccl.so
// (worker/comm/nccl_plugin.cc, around process_group_nccl.h). Like the CUDA backend
// (kernels/cuda_plugin.h), NCCL is not linked into dtrain, so dtrain starts without it; the
// plugin is loaded (common/plugin.h) only for --device cuda with more than one rank on distinct
// GPUs. Both sides come from one build; kNcclPluginAbi changes whenever comm::ProcessGroup,
// Store or these functions change.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dlaunch {
class Store;
namespace comm {
class ProcessGroup;
}
}  // namespace dlaunch

extern "C" {
// 3: ProcessGroup gained device_allreduce()/allreduce_device() (SyncBN on the device).
constexpr int kNcclPluginAbi = 3;
using DlaunchNcclAbiFn = int (*)();
// make_nccl_process_group(*store, rank, size, device, {timeout_ms, init_timeout_ms})
// (process_group_nccl.h: blocks until every rank joined, at most init_timeout_ms). The caller owns the result (delete it); nullptr with the reason in
// `why` (NUL-terminated, at most len bytes) on failure, e.g. a TimeoutError fetching the id.
using DlaunchNcclMakeGroupFn = dlaunch::comm::ProcessGroup* (*)(dlaunch::Store* store, int rank,
                                                                 int size, int device,
                                                                 int64_t timeout_ms,
                                                                 int64_t init_timeout_ms, char* why,
                                                                 size_t len);
}
