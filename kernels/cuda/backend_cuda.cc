// The CUDA backend: kernels::cuda behind kernels::Backend, for one device. Everything is queued
// on the legacy default stream of the device made current at creation (ops_cuda.h), so ops,
// copies and frees are ordered without events; cudaMemcpy to and from the host waits for the
// work queued before it.
#include "kernels/cuda/backend_cuda.h"

#include "common/error.h"
#include "kernels/cuda/ops_cuda.h"

namespace dlaunch::kernels::cuda {
namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, std::string device_name)
      : device_(device), device_name_(std::move(device_name)) {}

  std::string name() const override {
    return "cuda:" + std::to_string(device_) + " (" + device_name_ + ")";
  }
  bool host_accessible() const override { return false; }

  void* alloc(size_t bytes) override { return alloc_zeroed(bytes); }
  void free(void* p) noexcept override {
    if (p == nullptr) return;
    try {
      free_device(p);
    } catch (...) {
      // At exit the context may be gone already; memory is released with it.
    }
  }
  void zero(void* p, size_t bytes) override {
    if (bytes > 0) cuda::zero(p, bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) copy_to_device(dst, src, static_cast<int64_t>(bytes));
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) cuda::copy_to_host(dst, src, static_cast<int64_t>(bytes));
  }
  void stage_to_device(void* dst, const void* src, size_t bytes) override {
    cuda::stage_to_device(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0 && dst != src) copy_on_device(dst, src, bytes);
  }
  void synchronize() override { cuda::synchronize(); }

  // cuDNN has no channel-blocked float layout.
  int preferred_cblock(int64_t) const override { return 1; }

#define DL_OP(ret, name, params, args) \
  ret name params override { return cuda::name args; }
#include "kernels/op_signatures.inc"
#undef DL_OP

 private:
  int device_;
  std::string device_name_;
};

}  // namespace

Backend& open_backend(int device) {
  // One backend per device for the process's life: tensors may outlive any owner we could pick.
  static std::unique_ptr<CudaBackend> backends[64];
  DL_CHECK(device >= 0 && device < 64) << "CUDA device index " << device;
  std::string name = use_device(device);
  if (!backends[device]) backends[device] = std::make_unique<CudaBackend>(device, std::move(name));
  return *backends[device];
}

}  // namespace dlaunch::kernels::cuda
