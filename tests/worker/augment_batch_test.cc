// The augment_batch op (data on the device, issue 11) against the CPU loader: for a few seeds,
// epochs, recipes and both splits' transforms, the op's batch is data::make_batch's, bit for bit,
// on the CPU backend here and on the CUDA backend where a GPU is usable (that case skips with a
// reason elsewhere; scripts/gpu_check.sh runs it on a GPU machine). The CUDA kernel's
// per-element composition of the math is also checked here, compiled for the host.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/device.h"
#include "worker/data/batch_loader.h"
#include "worker/data/dataset.h"
#include "worker/data/random.h"
#include "worker/data/transforms.h"
#include "tests/support/cuda_device.h"

namespace dlaunch {
namespace {

using data::AugmentRecipe;
using data::ImageDataset;

// MNIST's shape (1 x 28 x 28) with random grey pixels: the loader's other geometry.
ImageDataset grey_images() {
  ImageDataset ds;
  ds.name = "grey";
  ds.channels = 1;
  ds.height = ds.width = 28;
  ds.mean = {data::kMnistMean};
  ds.stddev = {data::kMnistStd};
  data::SplitMix rng(99);
  for (int i = 0; i < 300; ++i) {
    for (int p = 0; p < 28 * 28; ++p) ds.pixels.push_back(static_cast<uint8_t>(rng.below(256)));
    ds.labels.push_back(static_cast<uint8_t>(i % 10));
  }
  return ds;
}

// A batch's indices: a scattered pick with a repeat, as a padded sampler's last batch has.
std::vector<int64_t> batch_indices(const ImageDataset& ds, uint64_t seed) {
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < 37; ++i)
    indices.push_back(static_cast<int64_t>(data::hash_combine(seed, static_cast<uint64_t>(i)) %
                                           static_cast<uint64_t>(ds.size())));
  indices.push_back(indices.front());
  return indices;
}

// The op's batch on `be`: the split and the indices copied into its memory, the floats back.
std::vector<float> op_batch(kernels::Backend& be, const ImageDataset& ds,
                            const std::vector<int64_t>& indices, const kernels::AugmentSpec& spec) {
  auto* images = static_cast<uint8_t*>(be.alloc(ds.pixels.size()));
  auto* idx = static_cast<int64_t*>(be.alloc(indices.size() * sizeof(int64_t)));
  const size_t out_elems = indices.size() * static_cast<size_t>(ds.image_elems());
  auto* out = static_cast<float*>(be.alloc(out_elems * sizeof(float)));
  be.copy_from_host(images, ds.pixels.data(), ds.pixels.size());
  be.copy_from_host(idx, indices.data(), indices.size() * sizeof(int64_t));
  be.augment_batch(spec, static_cast<int64_t>(indices.size()), images, idx, out);
  std::vector<float> host(out_elems);
  be.copy_to_host(host.data(), out, out_elems * sizeof(float));
  be.free(images);
  be.free(idx);
  be.free(out);
  return host;
}

// Every case: the op's bytes equal the loader's; *cases counts those compared.
void expect_op_equals_loader(kernels::Backend& be, int* cases) {
  for (const ImageDataset& ds : {data::make_synthetic(3, false), grey_images()}) {
    for (uint64_t seed : {0ull, 7ull, 123456789ull}) {
      const std::vector<int64_t> indices = batch_indices(ds, seed);
      for (int64_t epoch : {0, 1, 5}) {
        for (const AugmentRecipe& recipe : {AugmentRecipe{}, AugmentRecipe{8, false},
                                            AugmentRecipe{0, true}, AugmentRecipe{12, true}}) {
          for (bool augment : {true, false}) {
            const data::Batch want = data::make_batch(ds, indices, augment, seed, epoch, recipe);
            const std::vector<float> got =
                op_batch(be, ds, indices, data::augment_spec(ds, augment, seed, epoch, recipe));
            ASSERT_EQ(got.size(), want.images.size());
            // memcmp: bit for bit, so -0.0 against 0.0 or another rounding would show.
            ASSERT_EQ(std::memcmp(got.data(), want.images.data(), got.size() * sizeof(float)), 0)
                << be.name() << " " << ds.name << " seed " << seed << " epoch " << epoch
                << " cutout " << recipe.cutout << " alternating " << recipe.alternating_flip
                << " augment " << augment;
            ++*cases;
          }
        }
      }
    }
  }
}

TEST(AugmentBatch, CpuOpEqualsTheLoaderBitForBit) {
  int cases = 0;
  expect_op_equals_loader(kernels::cpu_backend(), &cases);
  EXPECT_EQ(cases, 2 * 3 * 3 * 4 * 2);
}

// The CUDA kernel writes each element with augmented_element, the CPU loop hoists parts of it
// out of each row: here, on the host, the kernel's composition gives the loader's bytes too (so
// the GPU case can differ only in what the device compiles differently).
TEST(AugmentBatch, TheKernelsPerElementMathEqualsTheLoaderOnTheHost) {
  int cases = 0;
  for (const ImageDataset& ds : {data::make_synthetic(3, false), grey_images()}) {
    const std::vector<int64_t> indices = batch_indices(ds, 5);
    for (int64_t epoch : {0, 3}) {
      for (const AugmentRecipe& recipe : {AugmentRecipe{}, AugmentRecipe{12, true}}) {
        for (bool augment : {true, false}) {
          const data::Batch want = data::make_batch(ds, indices, augment, 5, epoch, recipe);
          const kernels::AugmentSpec spec = data::augment_spec(ds, augment, 5, epoch, recipe);
          std::vector<float> got;
          for (int64_t index : indices) {
            const kernels::AugmentParams draw = spec.draw(index);
            for (int64_t c = 0; c < ds.channels; ++c)
              for (int64_t y = 0; y < ds.height; ++y)
                for (int64_t x = 0; x < ds.width; ++x)
                  got.push_back(kernels::augmented_element(spec, draw, ds.image(index), c, y, x));
          }
          ASSERT_EQ(got.size(), want.images.size());
          ASSERT_EQ(std::memcmp(got.data(), want.images.data(), got.size() * sizeof(float)), 0)
              << ds.name << " epoch " << epoch << " cutout " << recipe.cutout << " augment "
              << augment;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 2 * 2 * 2 * 2);
}

// The comparison above could pass for an op and a loader that both ignored the draws: the
// augmented batch must differ from the plain one, and between epochs.
TEST(AugmentBatch, TheDrawsChangeTheImages) {
  const ImageDataset ds = data::make_synthetic(3, false);
  const std::vector<int64_t> indices = batch_indices(ds, 1);
  kernels::Backend& be = kernels::cpu_backend();
  const auto plain = op_batch(be, ds, indices, data::augment_spec(ds, false, 1, 0));
  const auto epoch0 = op_batch(be, ds, indices, data::augment_spec(ds, true, 1, 0));
  const auto epoch1 = op_batch(be, ds, indices, data::augment_spec(ds, true, 1, 1));
  EXPECT_NE(plain, epoch0);
  EXPECT_NE(epoch0, epoch1);
}

TEST(AugmentBatch, CudaOpEqualsTheLoaderBitForBit) {
  kernels::Backend* cuda = testing::cuda_backend_or_null();
  if (cuda == nullptr) GTEST_SKIP() << "no CUDA device (or no CUDA plugin) on this machine";
  int cases = 0;
  expect_op_equals_loader(*cuda, &cases);
  EXPECT_EQ(cases, 2 * 3 * 3 * 4 * 2);
}

}  // namespace
}  // namespace dlaunch
