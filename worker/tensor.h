// Tensor: a contiguous float32 buffer with a shape and a device. Nothing more: no strides, no
// autograd, no views. Layers own their tensors and reuse them across steps (resize() keeps the
// allocation when it is large enough), so a training step allocates nothing after the first one.
//
// Memory is 64-byte aligned (one cache line, one AVX-512 vector) and zero-initialised on
// allocation. Only Device::kCpu is implemented today; kCuda is reserved for the CUDA path
// (kernels/cuda), and constructing a kCuda tensor throws StateError until it lands.
// Copying copies the data; a moved-from Tensor is empty. Not thread-safe; nothing here blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dlaunch {

enum class Device { kCpu, kCuda };

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::vector<int64_t> shape, Device device = Device::kCpu);
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
  Device device() const { return device_; }
  bool empty() const { return numel_ == 0; }

  // Changes the shape; reallocates (and zeroes) only when the new size exceeds the capacity,
  // otherwise the old contents stay in place.
  void resize(std::vector<int64_t> shape);
  void zero();
  void fill(float value);
  // "[2, 3, 4]" for messages.
  std::string shape_string() const;

 private:
  void allocate(int64_t capacity);
  void release();

  float* data_ = nullptr;
  int64_t numel_ = 0;
  int64_t capacity_ = 0;
  std::vector<int64_t> shape_;
  Device device_ = Device::kCpu;
};

}  // namespace dlaunch
