#include "worker/tensor.h"

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

Tensor::Tensor(std::vector<int64_t> shape, kernels::Backend& backend) : backend_(&backend) {
  resize(std::move(shape));
}

Tensor::Tensor(const Tensor& other) : backend_(other.backend_) {
  resize(other.shape_);
  if (numel_ > 0) backend_->copy(data_, other.data_, bytes());
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) {
    if (backend_ != other.backend_) {
      release();
      backend_ = other.backend_;
    }
    resize(other.shape_);
    if (numel_ > 0) backend_->copy(data_, other.data_, bytes());
  }
  return *this;
}

Tensor::Tensor(Tensor&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      numel_(std::exchange(other.numel_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      shape_(std::move(other.shape_)),
      backend_(other.backend_) {
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
    backend_ = other.backend_;
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
  if (numel_ > 0) backend_->zero(data_, bytes());
}

void Tensor::fill(float value) {
  if (numel_ > 0) backend_->fill(numel_, value, data_);
}

void Tensor::copy_from(const Tensor& src) {
  if (this == &src) return;
  resize(src.shape_);
  if (numel_ == 0) return;
  if (src.backend_ == backend_) {
    backend_->copy(data_, src.data_, bytes());
  } else if (src.backend_->host_accessible()) {
    backend_->copy_from_host(data_, src.data_, bytes());
  } else {
    DL_CHECK(backend_->host_accessible())
        << "copy between two devices (" << src.backend_->name() << " -> " << backend_->name() << ")";
    src.backend_->copy_to_host(data_, src.data_, bytes());
  }
}

void Tensor::copy_from_host(const float* src) {
  if (numel_ > 0) backend_->copy_from_host(data_, src, bytes());
}

std::vector<float> Tensor::to_host() const {
  std::vector<float> out(static_cast<size_t>(numel_));
  if (numel_ > 0) backend_->copy_to_host(out.data(), data_, bytes());
  return out;
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
  data_ = static_cast<float*>(backend_->alloc(static_cast<size_t>(capacity) * sizeof(float)));
  capacity_ = capacity;
}

void Tensor::release() {
  backend_->free(data_);
  data_ = nullptr;
  capacity_ = 0;
}

}  // namespace dlaunch
