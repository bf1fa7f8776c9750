#include "worker/tensor.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/error.h"

namespace dlaunch {
namespace {

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    DL_CHECK(d >= 0) << "negative dimension " << d;
    n *= d;
  }
  return n;
}

}  // namespace

Tensor::Tensor(std::vector<int64_t> shape, Device device) : device_(device) {
  if (device != Device::kCpu)
    throw StateError("Tensor: only Device::kCpu is implemented; CUDA tensors are not built yet");
  resize(std::move(shape));
}

Tensor::Tensor(const Tensor& other) : device_(other.device_) {
  resize(other.shape_);
  if (numel_ > 0) std::memcpy(data_, other.data_, bytes());
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) {
    device_ = other.device_;
    resize(other.shape_);
    if (numel_ > 0) std::memcpy(data_, other.data_, bytes());
  }
  return *this;
}

Tensor::Tensor(Tensor&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      numel_(std::exchange(other.numel_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      shape_(std::move(other.shape_)),
      device_(other.device_) {
  other.shape_.clear();
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    numel_ = std::exchange(other.numel_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    shape_ = std::move(other.shape_);
    other.shape_.clear();
    device_ = other.device_;
  }
  return *this;
}

Tensor::~Tensor() { release(); }

int64_t Tensor::dim(int i) const {
  const int n = ndim();
  if (i < 0) i += n;
  DL_CHECK(i >= 0 && i < n) << "dimension " << i << " of a " << n << "-d tensor";
  return shape_[static_cast<size_t>(i)];
}

void Tensor::resize(std::vector<int64_t> shape) {
  const int64_t n = product(shape);
  if (n > capacity_) allocate(n);
  numel_ = n;
  shape_ = std::move(shape);
}

void Tensor::zero() {
  if (numel_ > 0) std::memset(data_, 0, bytes());
}

void Tensor::fill(float value) {
  for (int64_t i = 0; i < numel_; ++i) data_[i] = value;
}

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape_[i]);
  }
  return s + "]";
}

void Tensor::allocate(int64_t capacity) {
  release();
  // Round up to whole cache lines: aligned_alloc requires a multiple of the alignment.
  const size_t bytes = (static_cast<size_t>(capacity) * sizeof(float) + 63) / 64 * 64;
  data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (data_ == nullptr) throw SystemError("Tensor: out of memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(data_, 0, bytes);
  capacity_ = capacity;
}

void Tensor::release() {
  std::free(data_);
  data_ = nullptr;
  capacity_ = 0;
}

}  // namespace dlaunch
