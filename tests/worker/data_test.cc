// Loaders on real data (skipped without ../shared/data), bad files, synthetic data, transforms
// and the background batch loader.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/error.h"
#include "worker/data/batch_loader.h"
#include "worker/data/dataset.h"
#include "worker/data/transforms.h"

namespace dlaunch::data {
namespace {
namespace fs = std::filesystem;

std::string data_dir() { return DLAUNCH_TEST_DATA_DIR; }

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("dtrain_data_test_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

void write_file(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void put_be32(std::vector<uint8_t>& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

// A tiny valid MNIST pair: n images of rows x cols, label i % 10, pixel value i.
void write_mnist(const fs::path& dir, const std::string& prefix, uint32_t n, bool gzip) {
  std::vector<uint8_t> images, labels;
  put_be32(images, 0x803);
  put_be32(images, n);
  put_be32(images, 28);
  put_be32(images, 28);
  for (uint32_t i = 0; i < n; ++i) images.insert(images.end(), 28 * 28, static_cast<uint8_t>(i));
  put_be32(labels, 0x801);
  put_be32(labels, n);
  for (uint32_t i = 0; i < n; ++i) labels.push_back(static_cast<uint8_t>(i % 10));
  auto write = [&](const std::string& base, const std::vector<uint8_t>& bytes) {
    if (!gzip) return write_file(dir / base, bytes);
    gzFile f = gzopen((dir / (base + ".gz")).c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  };
  write(prefix + "-images-idx3-ubyte", images);
  write(prefix + "-labels-idx1-ubyte", labels);
}

TEST(Cifar10, LoadsRealFiles) {
  fs::path dir = fs::path(data_dir()) / "cifar-10-batches-bin";
  if (!fs::exists(dir / "data_batch_1.bin")) GTEST_SKIP() << "no CIFAR-10 data in " << dir;
  ImageDataset train = load_cifar10(dir.string(), true);
  ImageDataset test = load_cifar10(dir.string(), false);
  EXPECT_EQ(train.size() % 10000, 0);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.channels, 3);
  EXPECT_EQ(train.image_elems(), 3072);
  // Every class present, roughly balanced; the red channel mean near the published 125.3.
  std::vector<int> counts(10);
  for (auto l : test.labels) counts.at(l)++;
  for (int c : counts) EXPECT_NEAR(c, 1000, 1);
  double red = 0;
  for (int64_t i = 0; i < train.size(); ++i) {
    for (int k = 0; k < 1024; ++k) red += train.image(i)[k];
  }
  EXPECT_NEAR(red / (train.size() * 1024.0), 125.3, 2.0);
}

TEST(Cifar10, RejectsTruncatedFileNamingIt) {
  TempDir dir;
  write_file(dir.path() / "data_batch_1.bin", std::vector<uint8_t>(3073 * 2 + 5, 1));
  try {
    load_cifar10(dir.path().string(), true);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("data_batch_1.bin"), std::string::npos) << msg;
    EXPECT_NE(msg.find("6151"), std::string::npos) << msg;   // found
    EXPECT_NE(msg.find("3073"), std::string::npos) << msg;   // expected multiple
  }
}

TEST(Cifar10, MissingFilesAreReported) {
  TempDir dir;
  EXPECT_THROW(load_cifar10(dir.path().string(), true), DataError);
  EXPECT_THROW(load_cifar10(dir.path().string(), false), DataError);
  std::vector<uint8_t> rec(3073, 7);
  rec[0] = 11;  // label out of range
  write_file(dir.path() / "test_batch.bin", rec);
  EXPECT_THROW(load_cifar10(dir.path().string(), false), DataError);
}

TEST(Mnist, LoadsRealFiles) {
  fs::path dir = fs::path(data_dir()) / "mnist";
  if (!fs::exists(dir / "t10k-images-idx3-ubyte.gz")) GTEST_SKIP() << "no MNIST data in " << dir;
  ImageDataset test = load_mnist(dir.string(), false);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(test.height, 28);
  EXPECT_EQ(test.channels, 1);
  double mean = 0;
  for (uint8_t p : test.pixels) mean += p;
  mean /= test.pixels.size() * 255.0;
  EXPECT_NEAR(mean, 0.13, 0.01);
}

TEST(Mnist, ReadsPlainAndGzipped) {
  for (bool gz : {false, true}) {
    TempDir dir;
    write_mnist(dir.path(), "train", 25, gz);
    ImageDataset ds = load_mnist(dir.path().string(), true);
    ASSERT_EQ(ds.size(), 25);
    EXPECT_EQ(ds.labels[13], 3);
    EXPECT_EQ(ds.image(13)[100], 13);
  }
}

TEST(Mnist, RejectsBadMagicAndCounts) {
  TempDir dir;
  write_mnist(dir.path(), "t10k", 5, false);
  // Swap the label file for one claiming 6 labels: counts disagree.
  std::vector<uint8_t> labels;
  put_be32(labels, 0x801);
  put_be32(labels, 6);
  labels.insert(labels.end(), 6, 1);
  write_file(dir.path() / "t10k-labels-idx1-ubyte", labels);
  EXPECT_THROW(load_mnist(dir.path().string(), false), DataError);
  // Bad magic in the image file.
  std::vector<uint8_t> images;
  put_be32(images, 0x1234);
  write_file(dir.path() / "t10k-images-idx3-ubyte", images);
  try {
    load_mnist(dir.path().string(), false);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("magic"), std::string::npos) << e.what();
  }
}

TEST(Synthetic, DeterministicBalancedAndSeedDependent) {
  ImageDataset a = make_synthetic(7, true), b = make_synthetic(7, true), c = make_synthetic(8, true);
  EXPECT_EQ(a.size(), 5000);
  EXPECT_EQ(make_synthetic(7, false).size(), 1000);
  EXPECT_EQ(a.pixels, b.pixels);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(a.pixels, c.pixels);
  std::set<int> classes(a.labels.begin(), a.labels.end());
  EXPECT_EQ(classes.size(), 10u);
}

// A nearest-class-mean classifier fit on train must beat chance on test by far: the data is
// learnable, so a learning curve on it means something.
TEST(Synthetic, IsLearnable) {
  ImageDataset train = make_synthetic(1, true), test = make_synthetic(1, false);
  const int64_t d = train.image_elems();
  std::vector<std::vector<double>> mean(10, std::vector<double>(d));
  std::vector<int> count(10);
  for (int64_t i = 0; i < train.size(); ++i) {
    count[train.labels[i]]++;
    for (int64_t k = 0; k < d; ++k) mean[train.labels[i]][k] += train.image(i)[k];
  }
  for (int c = 0; c < 10; ++c) for (auto& v : mean[c]) v /= count[c];
  int correct = 0;
  for (int64_t i = 0; i < test.size(); ++i) {
    int best = 0;
    double best_d = 1e300;
    for (int c = 0; c < 10; ++c) {
      double dist = 0;
      for (int64_t k = 0; k < d; ++k) dist += (test.image(i)[k] - mean[c][k]) * (test.image(i)[k] - mean[c][k]);
      if (dist < best_d) best_d = dist, best = c;
    }
    correct += best == test.labels[i];
  }
  EXPECT_GT(correct, 300);  // chance is 100; about 500 with these settings
}

TEST(Transforms, NormalisesAndPads) {
  ImageDataset ds;
  ds.channels = 1;
  ds.height = ds.width = 8;
  ds.mean = {0.5f};
  ds.stddev = {0.5f};
  ds.pixels.assign(64, 255);
  ds.labels = {0};
  std::vector<float> out(64);
  load_image(ds, 0, false, 0, 0, out.data());
  for (float v : out) EXPECT_FLOAT_EQ(v, 1.0f);
  // With augmentation, pixels shifted in from the padding are 0 in pixel space: -mean/std = -1.
  bool saw_pad = false;
  for (int64_t e = 0; e < 20 && !saw_pad; ++e) {
    AugmentParams a = draw_augment(3, e, 0);
    load_image(ds, 0, true, 3, e, out.data());
    for (float v : out) saw_pad |= (v == -1.0f);
    if (a.dx == 0 && a.dy == 0) continue;
  }
  EXPECT_TRUE(saw_pad);
}

TEST(Transforms, CropAndFlipMatchTheDrawnParameters) {
  ImageDataset ds;
  ds.channels = 1;
  ds.height = ds.width = 16;
  ds.mean = {0.0f};
  ds.stddev = {1.0f / 255.0f};  // out = pixel value
  for (int i = 0; i < 256; ++i) ds.pixels.push_back(static_cast<uint8_t>(i));
  ds.labels = {0};
  std::vector<float> out(256);
  for (int64_t e = 0; e < 30; ++e) {
    AugmentParams a = draw_augment(11, e, 0);
    EXPECT_LE(std::abs(a.dx), kCropPadding);
    EXPECT_LE(std::abs(a.dy), kCropPadding);
    load_image(ds, 0, true, 11, e, out.data());
    for (int y = 0; y < 16; ++y) {
      for (int x = 0; x < 16; ++x) {
        int sx = (a.flip ? 15 - x : x) + static_cast<int>(a.dx), sy = y + static_cast<int>(a.dy);
        float expect = (sx < 0 || sx >= 16 || sy < 0 || sy >= 16) ? 0.0f : static_cast<float>(sy * 16 + sx);
        ASSERT_FLOAT_EQ(out[y * 16 + x], expect) << "epoch " << e << " y " << y << " x " << x;
      }
    }
  }
  // The draw depends on the sample and epoch only: same inputs, same crop.
  AugmentParams p = draw_augment(11, 4, 9), q = draw_augment(11, 4, 9);
  EXPECT_EQ(p.dx, q.dx);
  EXPECT_EQ(p.flip, q.flip);
}

// A 1-channel 16x16 image whose normalised pixel value is its raw value (1 + y * 16 + x, so no
// pixel is 0 and a cutout shows).
ImageDataset ramp_image() {
  ImageDataset ds;
  ds.channels = 1;
  ds.height = ds.width = 16;
  ds.mean = {0.0f};
  ds.stddev = {1.0f / 255.0f};
  for (int i = 0; i < 256; ++i) ds.pixels.push_back(static_cast<uint8_t>(std::min(255, i + 1)));
  ds.labels = {0};
  return ds;
}

TEST(Transforms, RecipeOptionsOffDrawWhatTheDefaultDraws) {
  for (int64_t e = 0; e < 10; ++e) {
    for (int64_t i = 0; i < 10; ++i) {
      const AugmentParams a = draw_augment(5, e, i);
      const AugmentParams b = draw_augment(5, e, i, AugmentRecipe{6, false}, 16, 16);
      EXPECT_EQ(a.dx, b.dx);
      EXPECT_EQ(a.dy, b.dy);
      EXPECT_EQ(a.flip, b.flip);
    }
  }
}

TEST(Transforms, AlternatingFlipInvertsEachSamplesFlipEveryOtherEpoch) {
  const AugmentRecipe recipe{0, true};
  int flipped_in_epoch_0 = 0, coin_changes = 0;
  for (int64_t i = 0; i < 200; ++i) {
    flipped_in_epoch_0 += draw_augment(9, 0, i, recipe).flip;
    for (int64_t e = 0; e < 6; ++e) {
      ASSERT_NE(draw_augment(9, e, i, recipe).flip, draw_augment(9, e + 1, i, recipe).flip)
          << "sample " << i << " epoch " << e;
      coin_changes += draw_augment(9, e, i).flip != draw_augment(9, e + 1, i).flip;
    }
  }
  // Half the samples start flipped (a coin per sample, not one for all)...
  EXPECT_GT(flipped_in_epoch_0, 60);
  EXPECT_LT(flipped_in_epoch_0, 140);
  // ...while the default flip is a fresh coin each epoch, so it repeats about half the time.
  EXPECT_LT(coin_changes, 200 * 6 * 3 / 4);

  // The image is flipped as drawn (the crop as before).
  const ImageDataset ds = ramp_image();
  std::vector<float> out(256);
  for (int64_t e = 0; e < 4; ++e) {
    const AugmentParams a = draw_augment(9, e, 0, recipe, 16, 16);
    load_image(ds, 0, true, 9, e, out.data(), recipe);
    for (int y = 0; y < 16; ++y)
      for (int x = 0; x < 16; ++x) {
        const int sx = (a.flip ? 15 - x : x) + static_cast<int>(a.dx), sy = y + static_cast<int>(a.dy);
        const bool pad = sx < 0 || sx >= 16 || sy < 0 || sy >= 16;
        const float raw = static_cast<float>(std::min(255, sy * 16 + sx + 1));
        ASSERT_FLOAT_EQ(out[y * 16 + x], pad ? 0.0f : raw)
            << "epoch " << e << " y " << y << " x " << x;
      }
  }
}

TEST(Transforms, CutoutZeroesADrawnSquareInsideTheImageAndNothingElse) {
  const ImageDataset ds = ramp_image();
  const AugmentRecipe recipe{5, false};
  std::vector<float> out(256), plain(256);
  bool moved = false;
  int64_t first_top = -1, first_left = -1;
  for (int64_t e = 0; e < 12; ++e) {
    const AugmentParams a = draw_augment(4, e, 0, recipe, 16, 16);
    ASSERT_GE(a.cutout_top, 0);
    ASSERT_LE(a.cutout_top + 5, 16);
    ASSERT_GE(a.cutout_left, 0);
    ASSERT_LE(a.cutout_left + 5, 16);
    if (e == 0) {
      first_top = a.cutout_top;
      first_left = a.cutout_left;
    }
    moved |= a.cutout_top != first_top || a.cutout_left != first_left;
    load_image(ds, 0, true, 4, e, out.data(), recipe);
    load_image(ds, 0, true, 4, e, plain.data());
    for (int64_t y = 0; y < 16; ++y)
      for (int64_t x = 0; x < 16; ++x) {
        const bool inside = y >= a.cutout_top && y < a.cutout_top + 5 && x >= a.cutout_left &&
                            x < a.cutout_left + 5;
        ASSERT_FLOAT_EQ(out[y * 16 + x], inside ? 0.0f : plain[y * 16 + x]) << y << " " << x;
      }
  }
  EXPECT_TRUE(moved);
  // A square larger than the image is a usage error naming the flag.
  EXPECT_THROW(load_image(ds, 0, true, 4, 0, out.data(), AugmentRecipe{17, false}), UsageError);
}

TEST(BatchLoader, YieldsAllBatchesInOrder) {
  ImageDataset ds = make_synthetic(2, false);
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < 103; ++i) idx.push_back((i * 37) % ds.size());
  BatchLoader loader(ds, idx, 10, true, 5, 1);
  EXPECT_EQ(loader.num_batches(), 11);
  int64_t seen = 0;
  while (auto b = loader.next()) {
    std::vector<int64_t> expect_idx(idx.begin() + seen, idx.begin() + seen + b->size);
    Batch ref = make_batch(ds, expect_idx, true, 5, 1);
    EXPECT_EQ(b->images, ref.images);
    EXPECT_EQ(b->labels, ref.labels);
    seen += b->size;
  }
  EXPECT_EQ(seen, 103);
  EXPECT_FALSE(loader.next().has_value());
}

TEST(BatchLoader, StopsEarlyWithoutHanging) {
  ImageDataset ds = make_synthetic(2, false);
  std::vector<int64_t> idx(500);
  for (int64_t i = 0; i < 500; ++i) idx[i] = i;
  BatchLoader loader(ds, idx, 4, false, 0, 0);
  ASSERT_TRUE(loader.next().has_value());
}  // destructor joins the producer blocked on a full queue

}  // namespace
}  // namespace dlaunch::data
