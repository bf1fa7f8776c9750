// Collective communication among the ranks of one job, behind one small interface so the
// training loop does not care whether gloo (CPU, TCP), NCCL (GPU) or nothing (world of one) sits
// underneath. Modelled on c10d's ProcessGroup, reduced to what dtrain needs.
//
// Threading and ordering: the blocking calls may be made from one thread at a time (the
// training thread); every rank must issue the same collectives in the same order. Async
// allreduces run FIFO on the group's own communication thread over a separate channel, so a
// blocking collective (SyncBN during backward) may proceed while bucket allreduces are in
// flight; the async calls, too, must be issued in the same order on every rank.
//
// Timeouts: every collective gives up after the group's timeout (default 300 s) and throws
// TimeoutError; a peer that died surfaces as ConnectionError or TimeoutError. After either, the
// group is unusable: the worker exits so the launcher can restart the job, or (rank-level
// recovery, worker/comm/reformable_process_group.h) calls abandon(), destroys the group and
// joins a new one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"

namespace dlaunch::comm {

enum class ReduceOp { kSum, kAvg, kMax };

// A handle to an asynchronous collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective finished; rethrows its failure.
  virtual void wait() = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "gloo", "nccl", "local"

  // In-place elementwise reduction over all ranks. Blocking.
  virtual void allreduce(float* data, size_t count, ReduceOp op) = 0;
  virtual void allreduce(double* data, size_t count, ReduceOp op) = 0;
  // Copies `bytes` bytes at `data` from `root` to every rank. Blocking.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Every rank's `mine` (any sizes), indexed by rank. Meant for small metadata. Blocking.
  virtual std::vector<std::vector<uint8_t>> allgather(const std::vector<uint8_t>& mine) = 0;
  virtual void barrier() = 0;

  // Starts an in-place allreduce on the communication thread and returns at once. `data` must
  // stay valid and untouched until wait() returns.
  virtual std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op) = 0;

  // After a failure, before the group is destroyed: async work queued and not started fails at
  // once (instead of each waiting for a peer that is gone), and the peers' waits on this rank end
  // now rather than at the timeout (this rank's connections close; on one host, the shared-memory
  // all-reduce says this rank left). The group is unusable afterwards. Never throws.
  virtual void abandon() {}

  // SyncBN's statistics on a GPU (worker/ddp/sync_batch_norm.h). True when allreduce_device()
  // can reduce this rank's device memory in place without the host (NCCL). The CPU groups (gloo,
  // local) read host memory only: a caller with data on a device copies it through the host.
  virtual bool device_allreduce() const { return false; }
  // In-place allreduce of device memory, queued on the compute stream (after the kernels queued
  // before it, before those queued after) and returning at once: no host synchronisation, so a
  // CUDA graph can capture it. A failure or a collective past the timeout cannot be thrown to
  // the caller: the group ends the process with a message naming the collective (see the
  // group's header). Only where device_allreduce() is true; elsewhere it throws InternalError.
  virtual void allreduce_device(double* /*data*/, size_t /*count*/, ReduceOp /*op*/) {
    throw InternalError(
        "allreduce_device on the " + backend() +
        " process group, which reduces host memory only (device_allreduce() is false)");
  }
};

// The world of one: every collective is the identity (kAvg divides by 1).
std::unique_ptr<ProcessGroup> make_local_process_group();

}  // namespace dlaunch::comm
