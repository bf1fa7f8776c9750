// Flash checkpoints (worker/checkpoint/flash_checkpoint.h): the atomic flash copy, the background
// disk writer, and the choice between the flash copy and the disk checkpoint when resuming.
#include "worker/checkpoint/flash_checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "tests/support/subprocess.h"
#include "worker/data/split_cache.h"

namespace dlaunch::ckpt {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

Checkpoint state(int64_t step, const std::string& run_id) {
  Checkpoint c;
  c.meta = {{"epoch", 0}, {"step", step}, {"run_id", run_id}, {"epoch_step", step}};
  c.add("params", std::vector<float>(1000, static_cast<float>(step)));
  return c;
}

Bytes bytes_of(const Checkpoint& c) {
  return std::make_shared<const std::vector<uint8_t>>(encode_checkpoint(c));
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FlashWriter, KeepsOnlyTheNewestCopyUnderDtrain) {
  TempDir flash;
  FlashWriter w(flash.path());
  ASSERT_TRUE(w.enabled());
  EXPECT_EQ(w.dir(), flash.path() + "/dtrain");
  w.write(partial_checkpoint_file_name(0, 3), *bytes_of(state(3, "r")));
  std::string p = w.write(partial_checkpoint_file_name(0, 6), *bytes_of(state(6, "r")));
  EXPECT_EQ(names_in(w.dir()), std::vector<std::string>{partial_checkpoint_file_name(0, 6)});
  EXPECT_EQ(read_checkpoint(p).meta["step"], 6);
  EXPECT_FALSE(FlashWriter("").enabled());
}

// With an output directory the writer asks the agent to keep its copies there if the job ends
// without success (launcher/flash/flash_persist.h); without one it asks nothing.
TEST(FlashWriter, AsksTheAgentToKeepItsCopiesInTheOutputDir) {
  TempDir flash;
  FlashWriter w(flash.path(), "/abs/run/out");
  std::ifstream in(w.dir() + "/.persist_to");
  std::string target;
  std::getline(in, target);
  EXPECT_EQ(target, "/abs/run/out");
  w.write(partial_checkpoint_file_name(0, 3), *bytes_of(state(3, "r")));
  EXPECT_EQ(load_latest_valid(w.dir())->ckpt.meta["step"], 3) << "the request is no checkpoint";
  TempDir plain;
  FlashWriter none(plain.path());
  EXPECT_FALSE(fs::exists(none.dir() + "/.persist_to"));
}

TEST(FlashWriter, NewestWithFlashPicksTheNewerStateOfTheSameRunAndSkipsATornCopy) {
  TempDir flash, disk;
  FlashWriter w(flash.path());
  write_checkpoint(disk.file("checkpoint_epoch_0001.dtck"), state(8, "run-a"));
  auto from_disk = [&] { return load_latest_valid(disk.path()); };

  // No flash copy: the disk's.
  EXPECT_EQ(newest_with_flash(from_disk(), w.dir())->path, disk.file("checkpoint_epoch_0001.dtck"));
  // A newer flash copy of the same run wins; an older one does not.
  w.write(partial_checkpoint_file_name(1, 11), *bytes_of(state(11, "run-a")));
  EXPECT_EQ(newest_with_flash(from_disk(), w.dir())->ckpt.meta["step"], 11);
  w.write(partial_checkpoint_file_name(0, 5), *bytes_of(state(5, "run-a")));
  EXPECT_EQ(newest_with_flash(from_disk(), w.dir())->ckpt.meta["step"], 8);
  // Another run's flash copy is ignored; without a disk checkpoint it is taken.
  w.write(partial_checkpoint_file_name(1, 12), *bytes_of(state(12, "run-b")));
  EXPECT_EQ(newest_with_flash(from_disk(), w.dir())->ckpt.meta["step"], 8);
  EXPECT_EQ(newest_with_flash(std::nullopt, w.dir())->ckpt.meta["step"], 12);
  // A torn copy (half its bytes) is skipped: the disk's again.
  std::vector<uint8_t> torn = *bytes_of(state(13, "run-a"));
  torn.resize(torn.size() / 2);
  w.write(partial_checkpoint_file_name(1, 13), torn);
  EXPECT_EQ(newest_with_flash(from_disk(), w.dir())->ckpt.meta["step"], 8);
  EXPECT_FALSE(newest_with_flash(std::nullopt, w.dir()).has_value());
}

TEST(BackgroundPersister, WritesInOrderRunsTheFollowUpAndReportsFailures) {
  TempDir disk;
  std::atomic<int> after{0};
  {
    BackgroundPersister p;
    for (int s = 1; s <= 3; ++s) {
      p.submit(bytes_of(state(s, "r")), disk.file(partial_checkpoint_file_name(0, s)),
               [&] { after.fetch_add(1); });
    }
    p.wait();
    EXPECT_EQ(after.load(), 3);
    for (int s = 1; s <= 3; ++s) {
      EXPECT_EQ(read_checkpoint(disk.file(partial_checkpoint_file_name(0, s))).meta["step"], s);
    }
    // A directory that does not exist: the failure comes back from wait(), not lost.
    p.submit(bytes_of(state(4, "r")), disk.file("missing/x.dtck"), [&] { after.fetch_add(1); });
    EXPECT_THROW(p.wait(), SystemError);
    EXPECT_EQ(after.load(), 3);
    // And the persister goes on after it.
    p.submit(bytes_of(state(5, "r")), disk.file("five.dtck"));
    p.wait();
    EXPECT_TRUE(fs::exists(disk.file("five.dtck")));
  }
}

TEST(SplitCache, RoundTripsTheSplitsAndIgnoresADamagedCopy) {
  TempDir flash;
  data::ImageFolderOptions opts;
  const std::string key = data::split_cache_key("synthetic", "data", 7, opts);
  EXPECT_NE(key, data::split_cache_key("synthetic", "data", 8, opts));
  EXPECT_FALSE(data::read_split_cache(flash.path(), key).has_value());
  data::DatasetSplits s = data::load_splits("synthetic", "data", 7);
  s.train.classes = {"a", "b"};  // carried like the rest of the metadata
  data::write_split_cache(flash.path(), key, s);
  auto back = data::read_split_cache(flash.path(), key);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->train.pixels, s.train.pixels);
  EXPECT_EQ(back->train.labels, s.train.labels);
  EXPECT_EQ(back->test.pixels, s.test.pixels);
  EXPECT_EQ(back->train.name, s.train.name);
  EXPECT_EQ(back->train.classes, s.train.classes);
  EXPECT_EQ(back->test.mean, s.test.mean);
  // Another key never reads this copy; a flipped byte makes it unreadable (and it is reloaded).
  EXPECT_FALSE(data::read_split_cache(flash.path(), data::split_cache_key("mnist", "d", 7, opts)));
  const std::string file = fs::directory_iterator(flash.path())->path().string();
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    f.put('\x5a');
  }
  EXPECT_FALSE(data::read_split_cache(flash.path(), key).has_value());

  // A resampled split (--image_size, images at their own sizes) keeps each image's place and
  // size; --image_size is part of the key.
  data::ImageFolderOptions sized;
  sized.image_size = 64;
  const std::string sized_key = data::split_cache_key("synthetic", "data", 7, sized);
  EXPECT_NE(sized_key, key);
  data::DatasetSplits r = data::load_splits("synthetic", "data", 7);
  for (int64_t i = 0; i < r.train.size(); ++i) r.train.stored.push_back({i * 3 * 32 * 32, 32, 32});
  r.train.height = r.train.width = 64;
  data::write_split_cache(flash.path(), sized_key, r);
  back = data::read_split_cache(flash.path(), sized_key);
  ASSERT_TRUE(back.has_value());
  ASSERT_EQ(back->train.stored.size(), static_cast<size_t>(r.train.size()));
  EXPECT_EQ(back->train.stored[5].offset, 5 * 3 * 32 * 32);
  EXPECT_EQ(back->train.stored[5].height, 32);
  EXPECT_EQ(back->train.height, 64);
  EXPECT_EQ(back->train.pixels, r.train.pixels);
  EXPECT_FALSE(back->test.resampled());
}

}  // namespace
}  // namespace dlaunch::ckpt
