// Assembles one rank's batches for an epoch on a background thread, `prefetch` batches ahead,
// so image decoding and augmentation overlap with the forward/backward pass.
//
// Threading: next() is called from one consumer thread; it blocks until the next batch is ready.
// The destructor stops and joins the producer (it may block for the batch in progress). A
// failure in the producer is rethrown by next().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "worker/data/dataset.h"
#include "worker/data/transforms.h"

namespace dlaunch::data {

struct Batch {
  int64_t size = 0;
  std::vector<float> images;    // size * C * H * W, normalised
  std::vector<int32_t> labels;  // size
};

// Builds one batch synchronously (the producer's work; also handy in tests).
Batch make_batch(const ImageDataset& ds, const std::vector<int64_t>& indices, bool augment,
                 uint64_t seed, int64_t epoch, const AugmentRecipe& recipe = {});

class BatchLoader {
 public:
  // `ds` must outlive the loader. The last batch may be smaller (drop_last = false, as
  // PyTorch's DataLoader default).
  BatchLoader(const ImageDataset& ds, std::vector<int64_t> indices, int64_t batch_size,
              bool augment, uint64_t seed, int64_t epoch, int prefetch = 2,
              const AugmentRecipe& recipe = {});
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next batch, or nullopt at the end of the epoch.
  std::optional<Batch> next();
  int64_t num_batches() const { return num_batches_; }

 private:
  void produce();

  const ImageDataset& ds_;
  std::vector<int64_t> indices_;
  int64_t batch_size_;
  bool augment_;
  AugmentRecipe recipe_;
  uint64_t seed_;
  int64_t epoch_;
  size_t prefetch_;
  int64_t num_batches_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  int64_t produced_ = 0;
  int64_t consumed_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace dlaunch::data
