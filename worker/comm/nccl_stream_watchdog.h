// Watches the NCCL collectives a process group queues on the compute stream without waiting for
// them (SyncBN's allreduce_device, process_group.h). Nothing on the training thread waits for
// those with a deadline, and a later host synchronisation elsewhere (reading the loss) would block
// forever on a collective that a dead peer never completes. So a thread of its own polls an event
// recorded after each one, and the communicator's async error, like PyTorch's NCCL watchdog
// (TORCH_NCCL_ASYNC_ERROR_HANDLING=3, its default): on an error, or a collective not done within
// the timeout, it logs one line naming the collective, this rank and the peer if known, and ends
// the process (exit status 1) so the launcher restarts the group. It cannot throw into the
// training thread, which may be blocked in a CUDA call at that moment.
//
// Threading: watch() is called from the training thread; the polling thread starts at the first
// watch() and is joined by the destructor, which must run before the communicator is destroyed
// or aborted. Collectives queued while the stream is being captured into a CUDA graph are not
// watched here (their events belong to the graph); whoever replays the graph must watch it.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dlaunch::comm {

class NcclStreamWatchdog {
 public:
  // `who`: this rank for the message ("rank 0 of 2"); `peer`: the peer to blame ("rank 1" or
  // "a peer rank"). `comm` must outlive this object.
  NcclStreamWatchdog(ncclComm_t comm, int device, std::chrono::milliseconds timeout,
                     std::string who, std::string peer);
  ~NcclStreamWatchdog();
  NcclStreamWatchdog(const NcclStreamWatchdog&) = delete;
  NcclStreamWatchdog& operator=(const NcclStreamWatchdog&) = delete;

  // The collective `what` was just queued on `stream`: it must complete within the timeout.
  // Returns at once (records an event; throws InternalError if CUDA refuses).
  void watch(cudaStream_t stream, const char* what);

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    cudaEvent_t event;
    Clock::time_point deadline;
    const char* what;
  };
  void run();
  [[noreturn]] void fail(const std::string& why) const;

  ncclComm_t comm_;
  int device_;
  std::chrono::milliseconds timeout_;
  std::string who_, peer_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> spare_;  // completed events, reused (creating one costs microseconds)
  std::thread thread_;
};

}  // namespace dlaunch::comm
