// Tensor: a contiguous float32 buffer with a shape, in the memory of one kernels::Backend (its
// device). Nothing more: no strides, no autograd, no views. Layers own their tensors and reuse
// them across steps (resize() keeps the allocation when it is large enough), so a training step
// allocates nothing after the first one.
//
// Memory comes from the backend's alloc() (64-byte aligned, zero-initialised). data() is a
// pointer into that memory: on the CPU backend the host may use it directly; on a device whose
// memory the host cannot read (backend().host_accessible() false), pass it only to the backend's
// ops and copies, and read values with to_host(). A default-constructed Tensor is on the CPU.
// Copying copies the data on the same backend; a moved-from Tensor is empty. Not thread-safe;
// nothing here blocks beyond the backend's copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace dlaunch {

class Tensor {
 public:
  Tensor() = default;
  // An empty tensor on `backend` (resize() allocates there).
  explicit Tensor(kernels::Backend& backend) : backend_(&backend) {}
  explicit Tensor(std::vector<int64_t> shape, kernels::Backend& backend = kernels::cpu_backend());
  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor();

  float* data() { return data_; }
  const float* data() const { return data_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  // Size of dimension i; negative i counts from the end. DL_CHECKs the index.
  int64_t dim(int i) const;
  int64_t numel() const { return numel_; }
  size_t bytes() const { return static_cast<size_t>(numel_) * sizeof(float); }
  kernels::Backend& backend() const { return *backend_; }
  bool empty() const { return numel_ == 0; }

  // Changes the shape; reallocates (and zeroes) only when the new size exceeds the capacity,
  // otherwise the old contents stay in place.
  void resize(std::vector<int64_t> shape);
  void zero();
  void fill(float value);
  // Takes the shape and the values of `src`, which may live on another backend (host <-> device
  // copies go through whichever side is the device).
  void copy_from(const Tensor& src);
  // numel() floats from host memory / into a host vector.
  void copy_from_host(const float* src);
  std::vector<float> to_host() const;
  // "[2, 3, 4]" for messages.
  std::string shape_string() const;

 private:
  void allocate(int64_t capacity);
  void release();

  float* data_ = nullptr;
  int64_t numel_ = 0;
  int64_t capacity_ = 0;
  std::vector<int64_t> shape_;
  kernels::Backend* backend_ = &kernels::cpu_backend();
};

}  // namespace dlaunch
