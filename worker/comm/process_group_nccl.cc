#include "worker/comm/process_group_nccl.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "worker/comm/allgather_padded.h"
#include "worker/comm/nccl_stream_watchdog.h"

namespace dlaunch::comm {
namespace {

using SteadyClock = std::chrono::steady_clock;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw InternalError(fmt::format("CUDA {} failed: {}", what, cudaGetErrorString(e)));
  }
}

std::string nccl_message(ncclResult_t r, ncclComm_t comm, const char* what) {
  return fmt::format("NCCL {} failed: {} ({})", what, ncclGetErrorString(r), ncclGetLastError(comm));
}

// Device (or managed) memory that NCCL can read; anything else is staged.
bool device_accessible(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // plain host memory on old drivers: clear the error
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// Polling with a growing pause: the first polls spin (collectives of a few KB finish in
// microseconds), later ones sleep up to 1 ms so a long wait does not burn a core.
class Backoff {
 public:
  void pause() {
    if (++polls_ < 200) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min<int64_t>(1000, 10 * (polls_ - 199))));
    }
  }

 private:
  int64_t polls_ = 0;
};

ncclUniqueId exchange_id(Store& store, int rank, const std::string& key) {
  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw InternalError(nccl_message(r, nullptr, "get unique id"));
    store.set(key, Bytes(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof id));
  } else {
    Bytes b = store.get(key);  // waits at most the store's timeout (TimeoutError)
    if (b.size() != sizeof id) {
      throw ProtocolError(fmt::format("store key {} holds {} bytes; a NCCL unique id has {}", key,
                                      b.size(), sizeof id));
    }
    std::memcpy(&id, b.data(), sizeof id);
  }
  return id;
}

class NcclProcessGroup;

class EventWork : public Work {
 public:
  EventWork(NcclProcessGroup* pg, cudaEvent_t event) : pg_(pg), event_(event) {}
  ~EventWork() override { cudaEventDestroy(event_); }
  void wait() override;

 private:
  NcclProcessGroup* pg_;  // a Work must not outlive its group (as with gloo)
  cudaEvent_t event_;
};

class NcclProcessGroup : public ProcessGroup {
 public:
  NcclProcessGroup(Store& store, int rank, int size, int device, const NcclOptions& options)
      : rank_(rank), size_(size), device_(device), options_(options) {
    if (size < 1 || rank < 0 || rank >= size) {
      throw UsageError(fmt::format("NCCL process group: rank {} of size {} is invalid", rank, size));
    }
    compute_ = options.compute_stream ? static_cast<cudaStream_t>(options.compute_stream) : cudaStreamLegacy;
    try {
      check_cuda(cudaSetDevice(device), "set device");
      check_cuda(cudaStreamCreateWithFlags(&sync_stream_, cudaStreamNonBlocking), "stream create");
      check_cuda(cudaStreamCreateWithFlags(&async_stream_, cudaStreamNonBlocking), "stream create");
      check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "event create");
      check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "event create");
      const ncclUniqueId sync_id = exchange_id(store, rank, "nccl/sync_id");
      const ncclUniqueId async_id = exchange_id(store, rank, "nccl/async_id");
      init_comm(&sync_comm_, sync_id, "init (sync communicator)");
      init_comm(&async_comm_, async_id, "init (async communicator)");
      watchdog_ = std::make_unique<NcclStreamWatchdog>(sync_comm_, device, options_.timeout,
                                                       fmt::format("rank {} of {}", rank_, size_),
                                                       peer_name());
    } catch (...) {
      abort_comms();
      release_cuda();
      throw;
    }
  }

  ~NcclProcessGroup() override {
    cudaSetDevice(device_);
    watchdog_.reset();  // before the communicator it polls goes
    if (!aborted_) {
      // Finalize flushes queued collectives; if a peer died they never finish, so wait only
      // shutdown_timeout and then abort instead of blocking the exit of the worker.
      const auto deadline = SteadyClock::now() + options_.shutdown_timeout;
      bool clean = true;
      for (ncclComm_t comm : {sync_comm_, async_comm_}) {
        ncclResult_t r = ncclCommFinalize(comm);
        Backoff backoff;
        while (r == ncclInProgress && SteadyClock::now() < deadline) {
          backoff.pause();
          if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) r = ncclInternalError;
        }
        clean = clean && r == ncclSuccess;
      }
      if (clean) {
        ncclCommDestroy(async_comm_);
        ncclCommDestroy(sync_comm_);
        sync_comm_ = async_comm_ = nullptr;
      } else {
        abort_comms();
      }
    }
    release_cuda();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  void allreduce(float* data, size_t count, ReduceOp op) override {
    blocking_allreduce(data, count, sizeof(float), ncclFloat, op);
  }
  void allreduce(double* data, size_t count, ReduceOp op) override {
    blocking_allreduce(data, count, sizeof(double), ncclDouble, op);
  }

  bool device_allreduce() const override { return true; }

  // On the compute stream itself: after the kernels that wrote `data`, before those that read
  // it, with nothing for the host to wait on. It shares the sync communicator with the blocking
  // calls without racing them: those wait for the compute stream first (after_compute) and
  // complete before they return. The watchdog enforces the timeout (nccl_stream_watchdog.h).
  void allreduce_device(double* data, size_t count, ReduceOp op) override {
    ensure_usable();
    if (count == 0) return;
    if (!device_accessible(data)) {
      throw InternalError(
          "NCCL allreduce_device needs device memory; host data goes through allreduce()");
    }
    call(ncclAllReduce(data, data, count, ncclDouble, nccl_op(op), sync_comm_, compute_),
         sync_comm_, "SyncBN all-reduce");
    watchdog_->watch(compute_, "SyncBN all-reduce");
  }

  void broadcast(void* data, size_t bytes, int root) override {
    ensure_usable();
    if (bytes == 0) return;
    const bool staged = !device_accessible(data);
    void* buf = staged ? to_device(data, bytes) : data;
    after_compute(sync_stream_);
    call(ncclBroadcast(buf, buf, bytes, ncclUint8, root, sync_comm_, sync_stream_), sync_comm_, "broadcast");
    finish_blocking(staged ? data : nullptr, bytes, "broadcast");
  }

  std::vector<std::vector<uint8_t>> allgather(const std::vector<uint8_t>& mine) override {
    // Both all-gathers staged through device memory.
    auto sizes = [&](uint64_t my_size) { return gather_host(std::vector<uint64_t>{my_size}); };
    auto blocks = [&](const std::vector<uint8_t>& block) { return gather_host(block); };
    return allgather_padded(size_, mine, sizes, blocks);
  }

  void barrier() override {
    float zero = 0;
    allreduce(&zero, 1, ReduceOp::kSum);  // host memory: staged
  }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op) override {
    ensure_usable();
    if (!device_accessible(data)) {
      throw InternalError("NCCL allreduce_async needs device memory (the gradient buckets live on the GPU)");
    }
    after_compute(async_stream_);
    call(ncclAllReduce(data, data, count, ncclFloat, nccl_op(op), async_comm_, async_stream_), async_comm_,
         "async all-reduce");
    cudaEvent_t event{};
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event create");
    check_cuda(cudaEventRecord(event, async_stream_), "event record");
    return std::make_shared<EventWork>(this, event);
  }

  // Blocks until `event` completed, polling the communicator for errors, at most the timeout.
  void wait_event(cudaEvent_t event, ncclComm_t comm, const char* what) {
    ensure_usable();
    const auto deadline = SteadyClock::now() + options_.timeout;
    Backoff backoff;
    for (;;) {
      const cudaError_t q = cudaEventQuery(event);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        abort_comms();
        throw InternalError(fmt::format("CUDA error while waiting for NCCL {}: {}", what, cudaGetErrorString(q)));
      }
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &async);
      if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
        const std::string msg = nccl_message(r != ncclSuccess ? r : async, comm, what);
        abort_comms();
        throw ConnectionError(msg + "; a peer rank probably failed; the communicators were aborted");
      }
      if (SteadyClock::now() >= deadline) {
        abort_comms();
        throw TimeoutError(fmt::format(
            "NCCL {} on rank {} of {} did not complete within the collective timeout ({} ms, "
            "--collective_timeout): {} is stuck or gone; the communicators were aborted and this "
            "worker exits so the launcher restarts the group",
            what, rank_, size_, options_.timeout.count(),
            peer_name()));
      }
      backoff.pause();
    }
  }

  ncclComm_t async_comm() const { return async_comm_; }
  cudaStream_t compute_stream() const { return compute_; }

 private:
  std::string peer_name() const {
    return size_ == 2 ? fmt::format("rank {}", 1 - rank_) : std::string("a peer rank");
  }

  static ncclRedOp_t nccl_op(ReduceOp op) {
    return op == ReduceOp::kMax ? ncclMax : op == ReduceOp::kAvg ? ncclAvg : ncclSum;
  }

  void init_comm(ncclComm_t* comm, const ncclUniqueId& id, const char* what) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; we poll with a deadline
    const ncclResult_t r = ncclCommInitRankConfig(comm, size_, id, rank_, &config);
    call(r, *comm, what,
         options_.init_timeout.count() > 0 ? options_.init_timeout : options_.timeout);
  }

  // A NCCL call on a non-blocking communicator may return ncclInProgress: the communicator must
  // reach ncclSuccess before the next NCCL call (NCCL's documentation), so wait for it.
  void call(ncclResult_t r, ncclComm_t comm, const char* what) { call(r, comm, what, options_.timeout); }
  void call(ncclResult_t r, ncclComm_t comm, const char* what, std::chrono::milliseconds timeout) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) {
      const std::string msg = nccl_message(r, comm, what);
      abort_comms();
      if (r == ncclRemoteError || r == ncclSystemError) throw ConnectionError(msg);
      throw InternalError(msg);
    }
    const auto deadline = SteadyClock::now() + timeout;
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclInProgress;
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        const std::string msg = nccl_message(state, comm, what);
        abort_comms();
        throw ConnectionError(msg + "; the communicators were aborted");
      }
      if (SteadyClock::now() >= deadline) {
        abort_comms();
        throw TimeoutError(fmt::format("NCCL {} on rank {} of {} did not complete within {} ms (is "
                                       "every rank running?); the communicators were aborted",
                                       what, rank_, size_, timeout.count()));
      }
      backoff.pause();
    }
  }

  void ensure_usable() const {
    if (aborted_) {
      throw StateError("the NCCL process group was aborted after an earlier failure; the worker must "
                       "exit so the launcher can restart the job");
    }
  }

  // The comm stream starts after everything queued on the compute stream so far.
  void after_compute(cudaStream_t stream) {
    check_cuda(cudaEventRecord(ready_, compute_), "event record");
    check_cuda(cudaStreamWaitEvent(stream, ready_, 0), "stream wait");
  }

  void blocking_allreduce(void* data, size_t count, size_t elem, ncclDataType_t type, ReduceOp op) {
    ensure_usable();
    if (count == 0) return;
    const size_t bytes = count * elem;
    const bool staged = !device_accessible(data);
    void* buf = staged ? to_device(data, bytes) : data;
    after_compute(sync_stream_);
    call(ncclAllReduce(buf, buf, count, type, nccl_op(op), sync_comm_, sync_stream_), sync_comm_, "all-reduce");
    finish_blocking(staged ? data : nullptr, bytes, "all-reduce");
  }

  // Host bytes -> the device staging buffer, through pinned memory so no copy blocks the host
  // (a pageable copy would synchronise with whatever the stream is stuck on).
  void* to_device(const void* host, size_t bytes) {
    std::memcpy(pinned(bytes), host, bytes);
    void* dev = staging(bytes);
    check_cuda(cudaMemcpyAsync(dev, pinned_, bytes, cudaMemcpyHostToDevice, sync_stream_), "copy to device");
    return dev;
  }

  // Waits for the sync stream (with the deadline); copies the staged result back to `host`.
  void finish_blocking(void* host, size_t bytes, const char* what) {
    if (host) {
      check_cuda(cudaMemcpyAsync(pinned_, staging_, bytes, cudaMemcpyDeviceToHost, sync_stream_), "copy to host");
    }
    check_cuda(cudaEventRecord(done_, sync_stream_), "event record");
    wait_event(done_, sync_comm_, what);
    if (host) std::memcpy(host, pinned_, bytes);
  }

  template <typename T>
  std::vector<T> gather_host(const std::vector<T>& mine) {
    ensure_usable();
    const size_t bytes = mine.size() * sizeof(T);
    auto* dev = static_cast<uint8_t*>(staging(bytes * (size_ + 1)));
    auto* host = static_cast<uint8_t*>(pinned(bytes * size_));
    std::memcpy(host, mine.data(), bytes);
    check_cuda(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, sync_stream_), "copy to device");
    after_compute(sync_stream_);
    call(ncclAllGather(dev, dev + bytes, bytes, ncclUint8, sync_comm_, sync_stream_), sync_comm_, "all-gather");
    check_cuda(cudaMemcpyAsync(host, dev + bytes, bytes * size_, cudaMemcpyDeviceToHost, sync_stream_), "copy to host");
    check_cuda(cudaEventRecord(done_, sync_stream_), "event record");
    wait_event(done_, sync_comm_, "all-gather");
    std::vector<T> out(mine.size() * size_);
    std::memcpy(out.data(), host, bytes * size_);
    return out;
  }

  // Grow-only buffers; growing waits for the sync stream, which may still read the old ones.
  void* staging(size_t bytes) {
    return grow(staging_, staging_bytes_, bytes,
                [](void** p, size_t n) { return cudaMalloc(p, n); },
                [](void* p) { cudaFree(p); }, "malloc");
  }
  void* pinned(size_t bytes) {
    return grow(pinned_, pinned_bytes_, bytes,
                [](void** p, size_t n) { return cudaMallocHost(p, n); },
                [](void* p) { cudaFreeHost(p); }, "pinned malloc");
  }
  template <typename Alloc, typename Free>
  void* grow(void*& buffer, size_t& capacity, size_t bytes, Alloc alloc, Free release,
             const char* what) {
    if (bytes > capacity) {
      check_cuda(cudaEventRecord(done_, sync_stream_), "event record");
      wait_event(done_, sync_comm_, "staging");
      release(buffer);
      buffer = nullptr;
      capacity = 0;
      check_cuda(alloc(&buffer, bytes), what);
      capacity = bytes;
    }
    return buffer;
  }

  // ncclCommAbort returns without waiting for peers or queued work (unlike destroy/finalize).
  void abort_comms() {
    aborted_ = true;
    watchdog_.reset();
    if (async_comm_) ncclCommAbort(async_comm_);
    if (sync_comm_) ncclCommAbort(sync_comm_);
    async_comm_ = sync_comm_ = nullptr;
  }

  void release_cuda() {
    if (ready_) cudaEventDestroy(ready_);
    if (done_) cudaEventDestroy(done_);
    // After an abort the streams may hold collectives that never finish: destroying a stream
    // does not wait for its work, and the process is about to exit.
    if (async_stream_) cudaStreamDestroy(async_stream_);
    if (sync_stream_) cudaStreamDestroy(sync_stream_);
    if (!aborted_) {
      cudaFree(staging_);
      cudaFreeHost(pinned_);
    }
    ready_ = done_ = nullptr;
    async_stream_ = sync_stream_ = nullptr;
  }

  int rank_;
  int size_;
  int device_;
  NcclOptions options_;
  bool aborted_ = false;
  cudaStream_t compute_{};
  cudaStream_t sync_stream_{};
  cudaStream_t async_stream_{};
  cudaEvent_t ready_{};  // recorded on the compute stream before each collective
  cudaEvent_t done_{};   // recorded on the sync stream after each blocking collective
  ncclComm_t sync_comm_{};
  ncclComm_t async_comm_{};
  std::unique_ptr<NcclStreamWatchdog> watchdog_;  // of allreduce_device's collectives
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  void* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
};

void EventWork::wait() {
  pg_->wait_event(event_, pg_->async_comm(), "async all-reduce");
  // Later kernels on the compute stream read the reduced gradients.
  check_cuda(cudaStreamWaitEvent(pg_->compute_stream(), event_, 0), "stream wait");
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}

std::unique_ptr<ProcessGroup> make_nccl_process_group(Store& store, int rank, int size, int device,
                                                      const NcclOptions& options) {
  return std::make_unique<NcclProcessGroup>(store, rank, size, device, options);
}

}  // namespace dlaunch::comm
