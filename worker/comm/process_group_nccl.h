// The GPU process group: NCCL, its unique ids passed through the job's store (rank 0 creates
// them, the others read them). Built only when CUDA and NCCL are found (DLAUNCH_HAVE_CUDA).
//
// Memory: allreduce/allreduce_async/broadcast take device memory on this rank's GPU, or host
// memory (what the trainer's metadata collectives pass: loss sums, the checkpoint decision),
// which the blocking calls detect with cudaPointerGetAttributes and stage through a device buffer.
// allreduce_async needs device memory. allgather() takes and returns host memory (staged).
// allreduce_device (SyncBN's statistics) needs device memory and is queued on the compute stream
// itself, with no host wait: a watchdog thread enforces its timeout and ends the process on a
// failure (nccl_stream_watchdog.h), since nothing is there to throw to.
//
// Streams: two communicators, like the gloo group's two contexts: one for the blocking calls of
// the training thread (SyncBN), one for the async gradient buckets, each on its own
// cudaStreamNonBlocking stream, so they never interleave on one communicator. A non-blocking
// stream does not wait for the legacy default stream, so before every collective the group
// records an event on the compute stream (NcclOptions::compute_stream; the legacy default stream
// the CUDA kernels use when null) and makes its stream wait on it: the collective reads what the
// kernels queued before the call. Work::wait() makes the compute stream wait for the collective.
//
// Blocking and timeouts: the communicators are non-blocking (ncclConfig_t::blocking = 0), so no
// NCCL call can hang the caller. Construction polls ncclCommGetAsyncError until both
// communicators are up; every wait polls cudaEventQuery and ncclCommGetAsyncError. If a peer's
// failure surfaces as a NCCL error, the group aborts its communicators (ncclCommAbort) and throws
// ConnectionError; if nothing completes within NcclOptions::timeout (a dead peer often looks like
// that), it aborts and throws TimeoutError. Fetching the unique id waits for the store's own
// timeout (TimeoutError). After any failure the group is unusable (further calls throw
// StateError): the worker should exit so the launcher can restart the job. The destructor waits
// at most NcclOptions::shutdown_timeout for queued work, then aborts instead of blocking.
// Local misuse (bad device, CUDA errors) throws InternalError with the CUDA/NCCL message.
#pragma once

#include <chrono>
#include <memory>

#include "rendezvous/store/store.h"
#include "worker/comm/process_group.h"

namespace dlaunch::comm {

struct NcclOptions {
  // Each collective (dtrain's --collective_timeout).
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  // Creating the communicators: every rank must arrive, and a GPU's first init takes seconds,
  // so a short collective timeout must not cut it short (0: `timeout`).
  std::chrono::milliseconds init_timeout{0};
  std::chrono::milliseconds shutdown_timeout = std::chrono::seconds(10);
  // cudaStream_t the model's kernels run on; nullptr = the legacy default stream.
  void* compute_stream = nullptr;
};

// Number of CUDA devices; 0 when the driver reports any error (no GPU, no driver).
int cuda_device_count();

// `device`: the CUDA device for this rank (usually LOCAL_RANK). Blocks until every rank joined.
std::unique_ptr<ProcessGroup> make_nccl_process_group(Store& store, int rank, int size, int device,
                                                      const NcclOptions& options = {});

}  // namespace dlaunch::comm
