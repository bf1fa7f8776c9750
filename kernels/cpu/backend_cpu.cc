// The CPU backend: kernels::cpu behind kernels::Backend. Memory is 64-byte aligned host memory
// (one cache line, one AVX-512 vector), zeroed like the Tensor allocations it replaces.
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "kernels/backend.h"

namespace dlaunch::kernels {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  bool host_accessible() const override { return true; }

  void* alloc(size_t bytes) override {
    // aligned_alloc needs a whole number of alignments.
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded > 0 ? rounded : 64);
    if (p == nullptr) {
      throw SystemError("cpu backend: out of memory allocating " + std::to_string(rounded) + " bytes");
    }
    std::memset(p, 0, rounded);
    return p;
  }
  void free(void* p) noexcept override { std::free(p); }
  void zero(void* p, size_t bytes) override {
    if (bytes > 0) std::memset(p, 0, bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void stage_to_device(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
  }
  void synchronize() override {}

  int preferred_cblock(int64_t c) const override { return cpu::preferred_cblock(c); }
  ConvAutotuneStats conv_autotune_stats() const override { return cpu::conv_autotune_stats(); }

#define DL_OP(ret, name, params, args) \
  ret name params override { return cpu::name args; }
#include "kernels/op_signatures.inc"
#undef DL_OP
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

void set_host_threads(int n) { cpu::set_num_threads(n); }
int host_threads() { return cpu::num_threads(); }

}  // namespace dlaunch::kernels
