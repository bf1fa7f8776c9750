#include <algorithm>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace dlaunch::kernels::cuda {

int device_count() {
  int n = 0;
  // No driver or no device is an error here; both mean "no GPU", never a failure.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error for later callers
    return 0;
  }
  return n;
}

int device_count(std::string* why_none) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why_none) *why_none = std::string("cudaGetDeviceCount returned ") + cudaGetErrorName(e) + " (" +
                  cudaGetErrorString(e) + ")";
    return 0;
  }
  if (n == 0 && why_none) *why_none = "the CUDA runtime reports 0 devices";
  return n;
}

std::string use_device(int device) {
  DL_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  DL_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

void* alloc_zeroed(size_t bytes) {
  void* p = nullptr;
  DL_CUDA_CHECK(cudaMalloc(&p, bytes > 0 ? bytes : 1));
  DL_CUDA_CHECK(cudaMemset(p, 0, bytes > 0 ? bytes : 1));
  return p;
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  DL_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

void zero(void* p, size_t bytes) { DL_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes)); }

void synchronize() { DL_CUDA_CHECK(cudaDeviceSynchronize()); }

float* alloc_floats(int64_t n) {
  void* p = nullptr;
  DL_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(n > 0 ? n : 1) * sizeof(float)));
  return static_cast<float*>(p);
}

double* alloc_doubles(int64_t n) {
  void* p = nullptr;
  DL_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(n > 0 ? n : 1) * sizeof(double)));
  return static_cast<double*>(p);
}

void free_device(void* p) { DL_CUDA_CHECK(cudaFree(p)); }

void copy_to_device(void* dst, const void* src, int64_t bytes) {
  DL_CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
}

void copy_to_host(void* dst, const void* src, int64_t bytes) {
  DL_CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost));
}

namespace {

// Pinned host buffers for stage_to_device, used in turn. A cudaMemcpyAsync from pageable memory
// would wait for the queued work like cudaMemcpy; from pinned memory it is queued like a kernel.
// A slot is refilled only after the copy that last read it ran (its event): with four slots the
// host may run up to about two steps (two staged copies a step) ahead of the device before that
// wait holds it back, which is where it should be held back anyway.
class HostStaging {
 public:
  ~HostStaging() {
    // At thread exit the context may be gone already: ignore statuses.
    for (Slot& s : slots_) {
      if (s.host) cudaFreeHost(s.host);
      if (s.copied) cudaEventDestroy(s.copied);
    }
  }

  void copy(void* dst, const void* src, size_t bytes) {
    Slot& s = slots_[next_];
    next_ = (next_ + 1) % kSlots;
    if (s.in_flight) DL_CUDA_CHECK(cudaEventSynchronize(s.copied));
    if (bytes > s.capacity) {
      if (s.host) DL_CUDA_CHECK(cudaFreeHost(s.host));
      s.host = nullptr;
      s.capacity = 0;
      const size_t grown = std::max<size_t>(bytes, 4096);
      DL_CUDA_CHECK(cudaHostAlloc(&s.host, grown, cudaHostAllocDefault));
      s.capacity = grown;
    }
    if (!s.copied) DL_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    std::memcpy(s.host, src, bytes);
    DL_CUDA_CHECK(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, 0));
    DL_CUDA_CHECK(cudaEventRecord(s.copied, 0));
    s.in_flight = true;
  }

 private:
  static constexpr int kSlots = 4;
  struct Slot {
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t copied = nullptr;
    bool in_flight = false;
  };
  Slot slots_[kSlots];
  int next_ = 0;
};

thread_local HostStaging t_staging;

}  // namespace

void stage_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) t_staging.copy(dst, src, bytes);
}

namespace detail {

namespace {
struct Handles {
  cudnnHandle_t dnn = nullptr;
  cublasHandle_t blas = nullptr;
  void* buf[int(Scratch::kCount)] = {};
  size_t buf_bytes[int(Scratch::kCount)] = {};
  ~Handles() {
    // Destruction at thread exit may run after the CUDA context is gone: ignore statuses.
    if (dnn) cudnnDestroy(dnn);
    if (blas) cublasDestroy(blas);
    for (void* p : buf)
      if (p) cudaFree(p);
  }
};
thread_local Handles t_handles;
}  // namespace

cudnnHandle_t cudnn() {
  if (!t_handles.dnn) DL_CUDNN_CHECK(cudnnCreate(&t_handles.dnn));
  return t_handles.dnn;
}

cublasHandle_t cublas() {
  if (!t_handles.blas) DL_CUBLAS_CHECK(cublasCreate(&t_handles.blas));
  return t_handles.blas;
}

void* scratch(Scratch slot, size_t bytes) {
  void*& buf = t_handles.buf[int(slot)];
  size_t& have = t_handles.buf_bytes[int(slot)];
  if (bytes > have) {
    // The previous buffer may still be in use by queued work on the default stream.
    DL_CUDA_CHECK(cudaDeviceSynchronize());
    if (buf) DL_CUDA_CHECK(cudaFree(buf));
    buf = nullptr;
    have = 0;
    DL_CUDA_CHECK(cudaMalloc(&buf, bytes));
    have = bytes;
  }
  return buf;
}

}  // namespace detail
}  // namespace dlaunch::kernels::cuda
