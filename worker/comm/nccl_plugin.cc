// libdlaunch_nccl.so: the NCCL process group as a plugin dtrain loads at run time
// (nccl_plugin.h says why). Exceptions never cross the C functions; the group's own methods
// throw what process_group.h documents, into dtrain, as any ProcessGroup does.
#include <cstdio>
#include <exception>
#include <string>

#include "worker/comm/nccl_plugin.h"
#include "worker/comm/process_group_nccl.h"

extern "C" __attribute__((visibility("default"))) int dlaunch_nccl_plugin_abi() {
  return kNcclPluginAbi;
}

extern "C" __attribute__((visibility("default"))) dlaunch::comm::ProcessGroup*
dlaunch_nccl_make_group(dlaunch::Store* store, int rank, int size, int device, int64_t timeout_ms,
                        int64_t init_timeout_ms, char* why, size_t len) {
  try {
    dlaunch::comm::NcclOptions options;
    options.timeout = std::chrono::milliseconds(timeout_ms);
    options.init_timeout = std::chrono::milliseconds(init_timeout_ms);
    return dlaunch::comm::make_nccl_process_group(*store, rank, size, device, options).release();
  } catch (const std::exception& e) {
    if (why != nullptr && len > 0) std::snprintf(why, len, "%s", e.what());
    return nullptr;
  }
}
