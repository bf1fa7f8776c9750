// The GPU process group: NCCL, its unique ids passed through the job's store (rank 0 creates
// them, the others read them). Built only when CUDA and NCCL are found (DLAUNCH_HAVE_CUDA).
//
// Every buffer given to allreduce/broadcast/allreduce_async is DEVICE memory on this rank's GPU;
// allgather() and the byte-sized broadcast of metadata take host memory and stage it through the
// device. Two communicators, like the gloo group's two contexts: one for the blocking calls of
// the training thread (SyncBN), one for the async gradient buckets on their own CUDA stream, so
// they never interleave on one communicator.
//
// Blocking: construction blocks until all ranks joined (ncclCommInitRank) or the store times out
// (TimeoutError). Blocking calls synchronise their stream before returning; allreduce_async
// returns at once and Work::wait() synchronises on an event. A NCCL or CUDA failure throws
// ConnectionError (remote) or InternalError (local misuse) with NCCL's message.
#pragma once

#include <memory>

#include "rendezvous/store.h"
#include "worker/comm/process_group.h"

namespace dlaunch::comm {

// Number of CUDA devices; 0 when the driver reports any error (no GPU, no driver).
int cuda_device_count();

// `device`: the CUDA device for this rank (usually LOCAL_RANK).
std::unique_ptr<ProcessGroup> make_nccl_process_group(Store& store, int rank, int size, int device);

}  // namespace dlaunch::comm
