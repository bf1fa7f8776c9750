// A shared-memory all-reduce for small float/double vectors when every rank of a process group
// runs on one host. SyncBN issues ~40 tiny blocking all-reduces per step; through gloo each is a
// multi-message TCP handshake run by gloo's device thread, milliseconds and CPU time in epoll
// and wake-ups per call. Here each call is a copy into a slot, one atomic increment, a short
// spin or futex wait, and a sum.
//
// Segment layout (one POSIX shm object, unlinked as soon as every rank has mapped it, so nothing
// is left behind even on SIGKILL):
//
//   [Header: arrived[0], arrived[1] (32-bit counters)] [buffer 0: size x kSlotBytes] [buffer 1: ...]
//
// Call k of a rank uses buffer k % 2 (every rank issues the same calls in the same order):
//
//   write own slot -> arrived[b] += 1 -> wait until arrived[b] reaches this use's target
//        -> sum all slots in rank order (bit-identical result on every rank) -> return
//
// Why two buffers are enough: a rank can only write buffer b again at call k+2 after call k+1
// completed, i.e. after every rank arrived at k+1, i.e. after every rank finished reading call k.
// The counters only grow (wrapping mod 2^32; they start just below the wrap so that every run
// exercises it); a waiter compares with a signed difference.
//
// Blocking and timeouts: allreduce() blocks until all ranks arrived, spinning briefly then
// sleeping on the counter (FUTEX_WAIT on the shared word; the last arriver wakes everyone). After
// `timeout` it throws TimeoutError; the group is then unusable (like after a gloo timeout). A
// peer process that exited is noticed within ~10 ms of sleeping (its pid, exchanged at
// start-up, is gone or a zombie) and throws ConnectionError. A peer that abandons the group
// after a failure of its own (abandon(): it lives on to re-form the group) ends the others'
// waits at once with ConnectionError too.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "worker/comm/process_group.h"

namespace dlaunch::comm {

class ShmAllreduce {
 public:
  // Per-rank payload cap: larger vectors go to gloo.
  static constexpr size_t kSlotBytes = 64 * 1024;

  // Collective over `bootstrap` (its allgather/broadcast; must not route through an
  // ShmAllreduce yet). Returns nullptr on every rank, consistently, when shared memory cannot
  // be used: world of one, ranks on different hosts (host name + boot id differ), disabled by
  // DLAUNCH_SHM_ALLREDUCE=0 on any rank, or the segment could not be created or mapped on any
  // rank (logged). Blocks for the bootstrap collectives; their errors propagate.
  static std::unique_ptr<ShmAllreduce> create(ProcessGroup& bootstrap,
                                              std::chrono::milliseconds timeout);

  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // Whether `count` elements of `elem_bytes` fit a slot.
  static bool fits(size_t count, size_t elem_bytes) { return count * elem_bytes <= kSlotBytes; }

  // In-place reduction, same semantics as the gloo path: kSum and kMax in rank order, kAvg is
  // the sum times 1/size. Precondition: fits(count, sizeof(T)). Blocking; TimeoutError.
  void allreduce(float* data, size_t count, ReduceOp op);
  void allreduce(double* data, size_t count, ReduceOp op);

  // This rank leaves the group (after a failure; it will not arrive again): every rank waiting
  // in an allreduce that cannot complete now throws ConnectionError. Never blocks, never throws.
  void abandon();

 private:
  ShmAllreduce(void* base, size_t bytes, int rank, int size, std::chrono::milliseconds timeout);
  template <typename T>
  void run(T* data, size_t count, ReduceOp op);
  void wait_for(unsigned buffer, uint32_t target);

  void* base_;
  size_t bytes_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  uint64_t calls_ = 0;          // calls made, for the buffer parity and error messages
  uint32_t target_[2];
  std::vector<int> peer_pids_;  // other processes of the group; empty: rely on the timeout          // counter value at which the next use of each buffer is complete
};

}  // namespace dlaunch::comm
