#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "worker/data/dataset.h"
#include "worker/data/random.h"

namespace dlaunch::data {

double normal(SplitMix& rng) {
  double u1 = std::max(rng.uniform(), 1e-300);
  double u2 = rng.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

namespace {

constexpr int64_t kClasses = 10;
constexpr int64_t kSide = 32;
constexpr int64_t kChannels = 3;
constexpr int64_t kTrainSize = 5000;
constexpr int64_t kTestSize = 1000;
constexpr int kBlobs = 4;
// Tuned so that a nearest-class-mean classifier on raw pixels gets about half the test set and
// a small ResNet needs a few epochs to pass 90%: learning is visible, not instant.
constexpr double kBlobAmplitude = 0.30;
constexpr double kNoise = 0.30;
constexpr int64_t kMaxShift = 4;
constexpr double kColourJitter = 0.10;

// One template per class: a few Gaussian colour blobs on a grey background, values in [0, 1].
std::vector<float> make_template(uint64_t seed, int64_t cls) {
  SplitMix rng(hash_combine(seed, 0x5EED0000ull + static_cast<uint64_t>(cls)));
  std::vector<float> t(kChannels * kSide * kSide, 0.5f);
  for (int b = 0; b < kBlobs; ++b) {
    double cy = rng.uniform() * kSide, cx = rng.uniform() * kSide;
    double radius = 3.0 + rng.uniform() * 6.0;
    double colour[kChannels];
    for (auto& c : colour) c = (rng.uniform() - 0.5) * kBlobAmplitude;
    for (int64_t y = 0; y < kSide; ++y) {
      for (int64_t x = 0; x < kSide; ++x) {
        double d2 = (y - cy) * (y - cy) + (x - cx) * (x - cx);
        double w = std::exp(-d2 / (2 * radius * radius));
        for (int64_t c = 0; c < kChannels; ++c) {
          t[(c * kSide + y) * kSide + x] += static_cast<float>(colour[c] * w);
        }
      }
    }
  }
  return t;
}

}  // namespace

ImageDataset make_synthetic(uint64_t seed, bool train) {
  ImageDataset ds;
  ds.name = train ? "synthetic-train" : "synthetic-test";
  ds.channels = kChannels;
  ds.height = ds.width = kSide;
  ds.num_classes = kClasses;
  ds.mean = {0.5f, 0.5f, 0.5f};
  ds.stddev = {0.25f, 0.25f, 0.25f};
  std::vector<std::vector<float>> templates;
  for (int64_t c = 0; c < kClasses; ++c) templates.push_back(make_template(seed, c));

  int64_t n = train ? kTrainSize : kTestSize;
  ds.pixels.resize(n * ds.image_elems());
  ds.labels.resize(n);
  // Train and test draw from different streams of the same classes.
  uint64_t stream = hash_combine(seed, train ? 1 : 2);
  for (int64_t i = 0; i < n; ++i) {
    SplitMix rng(hash_combine(stream, static_cast<uint64_t>(i)));
    int64_t cls = static_cast<int64_t>(rng.below(kClasses));
    ds.labels[i] = static_cast<uint8_t>(cls);
    int64_t dy = static_cast<int64_t>(rng.below(2 * kMaxShift + 1)) - kMaxShift;
    int64_t dx = static_cast<int64_t>(rng.below(2 * kMaxShift + 1)) - kMaxShift;
    double contrast = 0.4 + 0.8 * rng.uniform();
    double offset[kChannels];
    for (auto& o : offset) o = (rng.uniform() - 0.5) * 2 * kColourJitter;
    const auto& t = templates[cls];
    uint8_t* out = ds.pixels.data() + i * ds.image_elems();
    for (int64_t c = 0; c < kChannels; ++c) {
      for (int64_t y = 0; y < kSide; ++y) {
        for (int64_t x = 0; x < kSide; ++x) {
          int64_t sy = std::clamp<int64_t>(y + dy, 0, kSide - 1);
          int64_t sx = std::clamp<int64_t>(x + dx, 0, kSide - 1);
          double v = 0.5 + offset[c] + (t[(c * kSide + sy) * kSide + sx] - 0.5) * contrast +
                     kNoise * normal(rng);
          out[(c * kSide + y) * kSide + x] =
              static_cast<uint8_t>(std::lround(std::clamp(v, 0.0, 1.0) * 255.0));
        }
      }
    }
  }
  return ds;
}

}  // namespace dlaunch::data
