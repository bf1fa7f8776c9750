#include "worker/data/batch_loader.h"

#include <algorithm>
#include <exception>
#include <thread>

#include "worker/data/transforms.h"

namespace dlaunch::data {

Batch make_batch(const ImageDataset& ds, const std::vector<int64_t>& indices, bool augment,
                 uint64_t seed, int64_t epoch, const AugmentRecipe& recipe) {
  Batch b;
  b.size = static_cast<int64_t>(indices.size());
  b.images.resize(b.size * ds.image_elems());
  b.labels.resize(b.size);
  auto load = [&](int64_t first, int64_t step) {
    for (int64_t i = first; i < b.size; i += step)
      load_image(ds, indices[i], augment, seed, epoch, b.images.data() + i * ds.image_elems(),
                 recipe);
  };
  // A dataset that decodes per epoch spends most of a batch in the decoder: share the images
  // among its decode threads (each has its own decoder, see image_pixels).
  const int threads =
      ds.decodes_per_epoch() ? static_cast<int>(std::min<int64_t>(ds.decode_threads, b.size)) : 1;
  std::vector<std::thread> helpers;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(std::max(threads, 1)));
  for (int t = 1; t < threads; ++t) {
    helpers.emplace_back([&, t] {
      try {
        load(t, threads);
      } catch (...) {
        errors[static_cast<size_t>(t)] = std::current_exception();
      }
    });
  }
  try {
    load(0, std::max(threads, 1));
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& h : helpers) h.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (int64_t i = 0; i < b.size; ++i) b.labels[i] = ds.labels[indices[i]];
  return b;
}

BatchLoader::BatchLoader(const ImageDataset& ds, std::vector<int64_t> indices, int64_t batch_size,
                         bool augment, uint64_t seed, int64_t epoch, int prefetch,
                         const AugmentRecipe& recipe)
    : ds_(ds),
      indices_(std::move(indices)),
      batch_size_(batch_size),
      augment_(augment),
      recipe_(recipe),
      seed_(seed),
      epoch_(epoch),
      prefetch_(static_cast<size_t>(std::max(prefetch, 1))),
      num_batches_((static_cast<int64_t>(indices_.size()) + batch_size - 1) / batch_size) {
  thread_ = std::thread([this] { produce(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BatchLoader::produce() {
  try {
    for (int64_t b = 0; b < num_batches_; ++b) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || ready_.size() < prefetch_; });
        if (stop_) return;
      }
      auto first = indices_.begin() + b * batch_size_;
      auto last = indices_.begin() + std::min<int64_t>((b + 1) * batch_size_, indices_.size());
      Batch batch = make_batch(ds_, std::vector<int64_t>(first, last), augment_, seed_, epoch_, recipe_);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ready_.push_back(std::move(batch));
        ++produced_;
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
  }
  cv_.notify_all();
}

std::optional<Batch> BatchLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (consumed_ == num_batches_) return std::nullopt;
  cv_.wait(lock, [&] { return !ready_.empty() || error_; });
  if (ready_.empty()) std::rethrow_exception(error_);
  Batch b = std::move(ready_.front());
  ready_.pop_front();
  ++consumed_;
  lock.unlock();
  cv_.notify_all();
  return b;
}

}  // namespace dlaunch::data
