#include "worker/comm/process_group_nccl.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace dlaunch::comm {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw InternalError(fmt::format("CUDA {} failed: {}", what, cudaGetErrorString(e)));
  }
}

void check_nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  std::string msg = fmt::format("NCCL {} failed: {} ({})", what, ncclGetErrorString(r),
                                ncclGetLastError(nullptr));
  if (r == ncclRemoteError || r == ncclSystemError) throw ConnectionError(msg);
  throw InternalError(msg);
}

class EventWork : public Work {
 public:
  explicit EventWork(cudaStream_t stream) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "event create");
    check_cuda(cudaEventRecord(event_, stream), "event record");
  }
  ~EventWork() override { cudaEventDestroy(event_); }
  void wait() override { check_cuda(cudaEventSynchronize(event_), "event synchronize"); }

 private:
  cudaEvent_t event_{};
};

ncclUniqueId exchange_id(Store& store, int rank, const std::string& key) {
  ncclUniqueId id;
  if (rank == 0) {
    check_nccl(ncclGetUniqueId(&id), "get unique id");
    store.set(key, Bytes(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof id));
  } else {
    Bytes b = store.get(key);
    if (b.size() != sizeof id) {
      throw ProtocolError(fmt::format("store key {} holds {} bytes; a NCCL unique id has {}", key,
                                      b.size(), sizeof id));
    }
    std::memcpy(&id, b.data(), sizeof id);
  }
  return id;
}

class NcclProcessGroup : public ProcessGroup {
 public:
  NcclProcessGroup(Store& store, int rank, int size, int device) : rank_(rank), size_(size), device_(device) {
    check_cuda(cudaSetDevice(device), "set device");
    check_cuda(cudaStreamCreateWithFlags(&sync_stream_, cudaStreamNonBlocking), "stream create");
    check_cuda(cudaStreamCreateWithFlags(&async_stream_, cudaStreamNonBlocking), "stream create");
    ncclUniqueId sync_id = exchange_id(store, rank, "nccl/sync_id");
    ncclUniqueId async_id = exchange_id(store, rank, "nccl/async_id");
    check_nccl(ncclCommInitRank(&sync_comm_, size, sync_id, rank), "init (sync)");
    check_nccl(ncclCommInitRank(&async_comm_, size, async_id, rank), "init (async)");
  }

  ~NcclProcessGroup() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(async_stream_);
    cudaStreamSynchronize(sync_stream_);
    ncclCommDestroy(async_comm_);
    ncclCommDestroy(sync_comm_);
    cudaStreamDestroy(async_stream_);
    cudaStreamDestroy(sync_stream_);
    cudaFree(staging_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  void allreduce(float* data, size_t count, ReduceOp op) override {
    enqueue_allreduce(data, count, ncclFloat, op, sync_comm_, sync_stream_);
    check_cuda(cudaStreamSynchronize(sync_stream_), "stream synchronize");
  }
  void allreduce(double* data, size_t count, ReduceOp op) override {
    enqueue_allreduce(data, count, ncclDouble, op, sync_comm_, sync_stream_);
    check_cuda(cudaStreamSynchronize(sync_stream_), "stream synchronize");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    check_nccl(ncclBroadcast(data, data, bytes, ncclUint8, root, sync_comm_, sync_stream_), "broadcast");
    check_cuda(cudaStreamSynchronize(sync_stream_), "stream synchronize");
  }

  std::vector<std::vector<uint8_t>> allgather(const std::vector<uint8_t>& mine) override {
    // Sizes first, then the bytes padded to the largest; both staged through device memory.
    std::vector<uint64_t> sizes = gather_host(std::vector<uint64_t>{mine.size()});
    uint64_t max_size = std::max<uint64_t>(1, *std::max_element(sizes.begin(), sizes.end()));
    std::vector<uint8_t> padded(max_size, 0);
    std::copy(mine.begin(), mine.end(), padded.begin());
    std::vector<uint8_t> all = gather_host(padded);
    std::vector<std::vector<uint8_t>> out(size_);
    for (int r = 0; r < size_; ++r) {
      auto first = all.begin() + static_cast<int64_t>(r * max_size);
      out[r].assign(first, first + static_cast<int64_t>(sizes[r]));
    }
    return out;
  }

  void barrier() override {
    float* one = static_cast<float*>(staging(sizeof(float)));
    check_cuda(cudaMemsetAsync(one, 0, sizeof(float), sync_stream_), "memset");
    allreduce(one, 1, ReduceOp::kSum);
  }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op) override {
    enqueue_allreduce(data, count, ncclFloat, op, async_comm_, async_stream_);
    return std::make_shared<EventWork>(async_stream_);
  }

 private:
  void enqueue_allreduce(void* data, size_t count, ncclDataType_t type, ReduceOp op, ncclComm_t comm,
                         cudaStream_t stream) {
    ncclRedOp_t nop = op == ReduceOp::kMax ? ncclMax : op == ReduceOp::kAvg ? ncclAvg : ncclSum;
    check_nccl(ncclAllReduce(data, data, count, type, nop, comm, stream), "all-reduce");
  }

  template <typename T>
  std::vector<T> gather_host(const std::vector<T>& mine) {
    size_t bytes = mine.size() * sizeof(T);
    auto* dev = static_cast<uint8_t*>(staging(bytes * (size_ + 1)));
    check_cuda(cudaMemcpyAsync(dev, mine.data(), bytes, cudaMemcpyHostToDevice, sync_stream_), "copy");
    check_nccl(ncclAllGather(dev, dev + bytes, bytes, ncclUint8, sync_comm_, sync_stream_), "all-gather");
    std::vector<T> out(mine.size() * size_);
    check_cuda(cudaMemcpyAsync(out.data(), dev + bytes, bytes * size_, cudaMemcpyDeviceToHost, sync_stream_),
               "copy");
    check_cuda(cudaStreamSynchronize(sync_stream_), "stream synchronize");
    return out;
  }

  void* staging(size_t bytes) {
    if (bytes > staging_bytes_) {
      check_cuda(cudaStreamSynchronize(sync_stream_), "stream synchronize");
      cudaFree(staging_);
      staging_ = nullptr;
      check_cuda(cudaMalloc(&staging_, bytes), "malloc");
      staging_bytes_ = bytes;
    }
    return staging_;
  }

  int rank_;
  int size_;
  int device_;
  cudaStream_t sync_stream_{};
  cudaStream_t async_stream_{};
  ncclComm_t sync_comm_{};
  ncclComm_t async_comm_{};
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}

std::unique_ptr<ProcessGroup> make_nccl_process_group(Store& store, int rank, int size, int device) {
  return std::make_unique<NcclProcessGroup>(store, rank, size, device);
}

}  // namespace dlaunch::comm
