#include "worker/train/epoch_batches.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "worker/data/transforms.h"

namespace dlaunch::train {

ResidentSplit::ResidentSplit(kernels::Backend& backend, const data::ImageDataset& ds)
    : backend_(backend), dataset_(ds) {
  DL_CHECK(!ds.resampled() && !ds.decodes_per_epoch()) << ds.name;  // data_placement checked
  pixels_ = static_cast<uint8_t*>(backend_.alloc(ds.pixels.size()));
  backend_.copy_from_host(pixels_, ds.pixels.data(), ds.pixels.size());
}

ResidentSplit::~ResidentSplit() {
  backend_.free(pixels_);
  backend_.free(indices_);
}

void ResidentSplit::assemble(const std::vector<int64_t>& indices, const kernels::AugmentSpec& spec,
                             Tensor& images) {
  DL_CHECK(&images.backend() == &backend_) << images.backend().name() << " vs " << backend_.name();
  const auto n = static_cast<int64_t>(indices.size());
  if (n > indices_capacity_) {  // the first (largest) batch sets it: later steps allocate nothing
    backend_.free(indices_);
    indices_ = static_cast<int64_t*>(backend_.alloc(static_cast<size_t>(n) * sizeof(int64_t)));
    indices_capacity_ = n;
  }
  // The one copy per step, staged: it does not wait for the queued work, and lands after the
  // previous batch's augment_batch read the buffer (both in the backend's order).
  backend_.stage_to_device(indices_, indices.data(), static_cast<size_t>(n) * sizeof(int64_t));
  images.resize({n, dataset_.channels, dataset_.height, dataset_.width});
  backend_.augment_batch(spec, n, pixels_, indices_, images.data());
}

EpochBatches::EpochBatches(const data::ImageDataset& ds, ResidentSplit* resident,
                           std::vector<int64_t> indices, int64_t batch_size, bool augment,
                           uint64_t seed, int64_t epoch, const data::AugmentRecipe& recipe)
    : dataset_(ds), resident_(resident), indices_(std::move(indices)), batch_size_(batch_size) {
  if (resident_ != nullptr) {
    DL_CHECK(&resident_->dataset() == &ds) << ds.name;
    spec_ = data::augment_spec(ds, augment, seed, epoch, recipe);
  } else {
    loader_.emplace(ds, std::move(indices_), batch_size, augment, seed, epoch, /*prefetch=*/2,
                    recipe);
  }
}

std::optional<data::Batch> EpochBatches::next(Tensor& images) {
  if (loader_) {
    std::optional<data::Batch> b = loader_->next();
    if (!b) return std::nullopt;
    DL_CHECK(images.backend().host_accessible()) << images.backend().name();
    images.resize({b->size, dataset_.channels, dataset_.height, dataset_.width});
    std::memcpy(images.data(), b->images.data(), b->images.size() * sizeof(float));
    b->images.clear();
    return b;
  }
  const auto total = static_cast<int64_t>(indices_.size());
  if (next_first_ >= total) return std::nullopt;
  const int64_t last = std::min(next_first_ + batch_size_, total);
  const std::vector<int64_t> batch(indices_.begin() + next_first_, indices_.begin() + last);
  next_first_ = last;
  resident_->assemble(batch, spec_, images);
  data::Batch b;
  b.size = static_cast<int64_t>(batch.size());
  b.labels.reserve(batch.size());
  for (int64_t i : batch) b.labels.push_back(dataset_.labels[static_cast<size_t>(i)]);
  return b;
}

}  // namespace dlaunch::train
