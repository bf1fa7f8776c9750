// One pass of batches for the training loop and the evaluation, from either source that
// --data_on_device picks (data_placement.h):
//   - the host loader (data::BatchLoader: a thread assembles float batches ahead), each batch
//     copied into a host tensor that the model's forward copies to its device;
//   - a ResidentSplit: the split's uint8 images uploaded once to the backend; per batch only
//     the sample indices are copied there (staged: no wait for the device) and the
//     augment_batch op writes the float batch in device memory, the same bytes the host loader
//     makes (kernels/augment.h).
// Labels always come from the host (the loss takes host labels on every backend).
//
// Threading: one consumer thread (the training thread); a ResidentSplit belongs to the backend's
// thread. Errors: as BatchLoader (its failures rethrown by next()) and the backend (device
// errors throw InternalError; an upload too large for the device's memory, SystemError).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/backend.h"
#include "worker/data/batch_loader.h"
#include "worker/data/dataset.h"
#include "worker/tensor.h"

namespace dlaunch::train {

// A split's images on a backend, uploaded at construction (blocks for the copy) and freed at
// destruction; a buffer for one batch's indices. `ds` must outlive it.
class ResidentSplit {
 public:
  ResidentSplit(kernels::Backend& backend, const data::ImageDataset& ds);
  ~ResidentSplit();
  ResidentSplit(const ResidentSplit&) = delete;
  ResidentSplit& operator=(const ResidentSplit&) = delete;

  // images := the batch of `indices` as `spec` says (data::augment_spec), on the backend.
  void assemble(const std::vector<int64_t>& indices, const kernels::AugmentSpec& spec,
                Tensor& images);
  const data::ImageDataset& dataset() const { return dataset_; }

 private:
  kernels::Backend& backend_;
  const data::ImageDataset& dataset_;
  uint8_t* pixels_ = nullptr;
  int64_t* indices_ = nullptr;
  int64_t indices_capacity_ = 0;
};

class EpochBatches {
 public:
  // `resident` null: the host loader over `ds`. Otherwise `resident` holds `ds`. The last batch
  // may be smaller (as BatchLoader).
  EpochBatches(const data::ImageDataset& ds, ResidentSplit* resident, std::vector<int64_t> indices,
               int64_t batch_size, bool augment, uint64_t seed, int64_t epoch,
               const data::AugmentRecipe& recipe = {});

  // The next batch: its images put into `images` (a host tensor for the host loader, one on the
  // resident split's backend otherwise), its size and labels returned (Batch::images stays
  // empty); nullopt at the end.
  std::optional<data::Batch> next(Tensor& images);

 private:
  const data::ImageDataset& dataset_;
  ResidentSplit* resident_;
  std::vector<int64_t> indices_;
  int64_t batch_size_;
  kernels::AugmentSpec spec_;  // resident path
  int64_t next_first_ = 0;     // resident path: the next batch's first entry of indices_
  std::optional<data::BatchLoader> loader_;  // host path
};

}  // namespace dlaunch::train
