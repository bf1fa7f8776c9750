#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "worker/checkpoint/checkpoint.h"

namespace dlaunch::ckpt {
namespace {
namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dtrain_ckpt_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static Checkpoint sample(int64_t epoch, const std::string& run_id = "") {
    Checkpoint c;
    c.meta["epoch"] = epoch;
    if (!run_id.empty()) c.meta["run_id"] = run_id;
    c.meta["config"] = {{"model", "resnet18"}, {"width", 16}};
    std::vector<float> params(1000);
    for (size_t i = 0; i < params.size(); ++i) params[i] = 0.001f * static_cast<float>(i) - 0.3f;
    c.add("params", params);
    c.add("optimizer.state", {1.5f, -2.25f, 1e-30f});
    c.add("empty", {});
    return c;
  }

  std::vector<uint8_t> read_bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }

  fs::path dir_;
};

TEST_F(CheckpointTest, RoundTrip) {
  fs::path p = dir_ / checkpoint_file_name(3);
  write_checkpoint(p.string(), sample(3));
  Checkpoint back = read_checkpoint(p.string());
  Checkpoint want = sample(3);
  EXPECT_EQ(back.meta, want.meta);
  ASSERT_EQ(back.arrays.size(), want.arrays.size());
  for (size_t i = 0; i < want.arrays.size(); ++i) {
    EXPECT_EQ(back.arrays[i].first, want.arrays[i].first);
    EXPECT_EQ(back.arrays[i].second, want.arrays[i].second);  // bit-exact
  }
  ASSERT_NE(back.find("optimizer.state"), nullptr);
  EXPECT_EQ(back.find("missing"), nullptr);
  // No temporary file left behind.
  for (auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST_F(CheckpointTest, EveryFlippedByteOrTruncationIsDetected) {
  std::vector<uint8_t> good = encode_checkpoint(sample(1));
  // Flip each byte of the header and a spread of payload bytes.
  for (size_t i = 0; i < good.size(); i += (i < 64 ? 1 : 97)) {
    auto bad = good;
    bad[i] ^= 0x5A;
    EXPECT_THROW(decode_checkpoint(bad, "x"), CheckpointError) << "byte " << i;
  }
  for (size_t len : {size_t{0}, size_t{10}, size_t{31}, size_t{32}, good.size() / 2, good.size() - 1}) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<int64_t>(len));
    EXPECT_THROW(decode_checkpoint(cut, "x"), CheckpointError) << "length " << len;
  }
  auto longer = good;
  longer.push_back(0);
  EXPECT_THROW(decode_checkpoint(longer, "x"), CheckpointError);
}

TEST_F(CheckpointTest, ErrorsNameTheFile) {
  fs::path p = dir_ / "checkpoint_epoch_0002.dtck";
  write_bytes(p, {'n', 'o', 'p', 'e'});
  try {
    read_checkpoint(p.string());
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_checkpoint((dir_ / "absent.dtck").string()), CheckpointError);
}

TEST_F(CheckpointTest, LatestValidSkipsCorruptAndIgnoresTemporaries) {
  for (int64_t e : {1, 2, 3}) write_checkpoint((dir_ / checkpoint_file_name(e)).string(), sample(e));
  // Epoch 3 damaged in the middle; a stale temporary file for epoch 4 (a writer killed mid-write).
  fs::path p3 = dir_ / checkpoint_file_name(3);
  auto bytes = read_bytes(p3);
  bytes[bytes.size() / 2] ^= 1;
  write_bytes(p3, bytes);
  write_bytes(dir_ / (checkpoint_file_name(4) + ".tmp.123"), {1, 2, 3});
  auto latest = load_latest_valid(dir_.string());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->ckpt.meta["epoch"], 2);
  EXPECT_EQ(latest->path, (dir_ / checkpoint_file_name(2)).string());
  EXPECT_EQ(list_checkpoints(dir_.string()).size(), 3u);

  EXPECT_FALSE(load_latest_valid((dir_ / "nonexistent").string()).has_value());
}

TEST_F(CheckpointTest, EpochNumbersBeyondInt64AreSkippedWithAWarning) {
  write_checkpoint((dir_ / checkpoint_file_name(2)).string(), sample(2));
  // A valid file under a name whose number overflows int64 (std::stoll used to throw
  // std::out_of_range out of --resume auto); the largest int64 itself is still a name of ours.
  const std::string huge = "checkpoint_epoch_99999999999999999999999.dtck";
  const std::string max = "checkpoint_epoch_9223372036854775807.dtck";
  const std::string over = "checkpoint_epoch_9223372036854775808.dtck";
  write_checkpoint((dir_ / huge).string(), sample(7));
  write_checkpoint((dir_ / over).string(), sample(8));
  write_checkpoint((dir_ / max).string(), sample(9));
  ::testing::internal::CaptureStderr();
  const auto paths = list_checkpoints(dir_.string());
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(paths[0], (dir_ / max).string());
  EXPECT_EQ(paths[1], (dir_ / checkpoint_file_name(2)).string());
  EXPECT_NE(err.find(huge), std::string::npos) << err;
  EXPECT_NE(err.find(over), std::string::npos) << err;
  EXPECT_NE(err.find("does not fit in 64 bits"), std::string::npos) << err;
  // Listed again (every epoch's pruning lists the directory): said once, not every epoch.
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(list_checkpoints(dir_.string()).size(), 2u);
  const std::string again = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(again.find("does not fit in 64 bits"), std::string::npos) << again;

  fs::remove(dir_ / max);
  ::testing::internal::CaptureStderr();
  auto latest = load_latest_valid(dir_.string());
  ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->ckpt.meta["epoch"], 2);
}

TEST_F(CheckpointTest, UnreadableDirectoryIsReportedNotTakenForEmpty) {
  // A regular file where the directory should be: opening it as a directory fails (ENOTDIR), the
  // same path any unreadable directory takes (EACCES cannot be tested as root).
  const fs::path not_dir = dir_ / "plain_file";
  write_bytes(not_dir, {1, 2, 3});
  try {
    list_checkpoints(not_dir.string());
    FAIL() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cannot open checkpoint directory " + not_dir.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("ot a directory"), std::string::npos) << msg;
  }
  EXPECT_THROW(load_latest_valid(not_dir.string()), CheckpointError);
  // Pruning is best effort: it warns and goes on.
  ::testing::internal::CaptureStderr();
  EXPECT_NO_THROW(prune_checkpoints(not_dir.string(), 1, "run"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("not pruning old checkpoints"), std::string::npos) << err;
  // A directory that does not exist yet simply holds no checkpoints.
  EXPECT_TRUE(list_checkpoints((dir_ / "absent").string()).empty());
  if (::geteuid() != 0) {
    const fs::path locked = dir_ / "locked";
    fs::create_directories(locked);
    fs::permissions(locked, fs::perms::none);
    EXPECT_THROW(list_checkpoints(locked.string()), CheckpointError);
    fs::permissions(locked, fs::perms::owner_all);
  }
}

TEST_F(CheckpointTest, RequireArraysNamesTheMissingOrMisSizedArray) {
  Checkpoint c = sample(1);
  c.add("buffer.bn1.running_mean", std::vector<float>(16));
  EXPECT_NO_THROW(require_arrays(c, "ck", {{"params", 1000}, {"buffer.bn1.running_mean", 16}}));
  try {
    require_arrays(c, "ck.dtck", {{"params", 1000}, {"buffer.bn1.running_var", 16}});
    FAIL() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ck.dtck has no 'buffer.bn1.running_var' array"), std::string::npos) << msg;
  }
  try {
    require_arrays(c, "ck.dtck", {{"buffer.bn1.running_mean", 32}});
    FAIL() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("holds 16 values in 'buffer.bn1.running_mean'; this model needs 32"),
              std::string::npos) << msg;
  }
}

TEST_F(CheckpointTest, ReplacingKeepsTheOldFileUntilTheNewOneIsComplete) {
  fs::path p = dir_ / checkpoint_file_name(5);
  write_checkpoint(p.string(), sample(5));
  auto inode_before = fs::status(p).permissions();
  (void)inode_before;
  // A writer to a directory that vanished fails cleanly and leaves nothing half-written.
  EXPECT_THROW(write_checkpoint((dir_ / "gone" / "c.dtck").string(), sample(1)), SystemError);
  Checkpoint c = sample(6);
  write_checkpoint(p.string(), c);
  EXPECT_EQ(read_checkpoint(p.string()).meta["epoch"], 6);
}

// The issue-9 loss: a new run (--resume none) in a directory holding an earlier run's
// higher-numbered checkpoints had its own deleted by keep-newest-3 at once.
TEST_F(CheckpointTest, PruneKeepsOnlyItsOwnRunsNewestAndNeverTouchesAnotherRun) {
  for (int64_t e : {8, 9, 10}) {
    write_checkpoint((dir_ / checkpoint_file_name(e)).string(), sample(e, "old"));
  }
  for (int64_t e : {1, 2, 3, 4, 5}) {
    write_checkpoint((dir_ / checkpoint_file_name(e)).string(), sample(e, "new"));
    prune_checkpoints(dir_.string(), 3, "new");
  }
  std::vector<std::string> want;
  for (int64_t e : {10, 9, 8, 5, 4, 3}) want.push_back((dir_ / checkpoint_file_name(e)).string());
  EXPECT_EQ(list_checkpoints(dir_.string()), want);
  // A checkpoint without a run id (an older dtrain) is nobody's to prune either.
  write_checkpoint((dir_ / checkpoint_file_name(0)).string(), sample(0));
  prune_checkpoints(dir_.string(), 1, "new");
  EXPECT_TRUE(fs::exists(dir_ / checkpoint_file_name(0)));
  EXPECT_TRUE(fs::exists(dir_ / checkpoint_file_name(8)));
  EXPECT_TRUE(fs::exists(dir_ / checkpoint_file_name(5)));
  EXPECT_FALSE(fs::exists(dir_ / checkpoint_file_name(4)));
}

TEST_F(CheckpointTest, CorruptCheckpointsTakeNoRetentionSlot) {
  for (int64_t e : {1, 2, 3, 4, 5}) {
    write_checkpoint((dir_ / checkpoint_file_name(e)).string(), sample(e, "run"));
  }
  // The two newest are damaged: keep-3 must still keep three good ones (3, 2, 1).
  for (int64_t e : {4, 5}) {
    fs::path p = dir_ / checkpoint_file_name(e);
    auto bytes = read_bytes(p);
    bytes[bytes.size() / 2] ^= 1;
    write_bytes(p, bytes);
  }
  prune_checkpoints(dir_.string(), 3, "run");
  for (int64_t e : {1, 2, 3}) EXPECT_TRUE(fs::exists(dir_ / checkpoint_file_name(e))) << e;
  const auto files = scan_checkpoints(dir_.string());
  ASSERT_EQ(files.size(), 5u);
  EXPECT_FALSE(files[0].valid);
  EXPECT_NE(files[0].error.find("corrupt"), std::string::npos) << files[0].error;
  EXPECT_TRUE(files[2].valid);
  EXPECT_EQ(files[2].run_id(), "run");
  EXPECT_EQ(files[0].run_id(), "");
}

TEST_F(CheckpointTest, StaleTemporariesAreRemovedAtStart) {
  const fs::path dead = dir_ / (checkpoint_file_name(4) + ".tmp.999999999");  // no such pid
  const fs::path own = dir_ / (checkpoint_file_name(5) + ".tmp." + std::to_string(::getpid()));
  const fs::path partial = dir_ / (partial_checkpoint_file_name(5, 123) + ".tmp.1");
  const fs::path foreign = dir_ / "notes.txt.tmp.1";  // not a checkpoint's temporary
  for (const auto& p : {dead, own, partial, foreign}) write_bytes(p, {1, 2, 3});
  write_checkpoint((dir_ / checkpoint_file_name(3)).string(), sample(3));
  auto removed = remove_stale_temporaries(dir_.string());
  std::sort(removed.begin(), removed.end());
  std::vector<std::string> want = {dead.string(), own.string(), partial.string()};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(removed, want);
  EXPECT_TRUE(fs::exists(foreign));
  EXPECT_TRUE(fs::exists(dir_ / checkpoint_file_name(3)));
  EXPECT_TRUE(remove_stale_temporaries((dir_ / "absent").string()).empty());
}

TEST_F(CheckpointTest, StopInsideAnEpochSortsBetweenItsNeighbours) {
  EXPECT_EQ(partial_checkpoint_file_name(2, 57), "checkpoint_epoch_0002_step_00000057.dtck");
  for (const std::string& name :
       {checkpoint_file_name(2), partial_checkpoint_file_name(2, 57), checkpoint_file_name(3),
        partial_checkpoint_file_name(2, 9), partial_checkpoint_file_name(3, 80)}) {
    write_checkpoint((dir_ / name).string(), sample(0));
  }
  write_bytes(dir_ / "checkpoint_epoch_0002_step_.dtck", {1});  // not a name of ours
  write_bytes(dir_ / "checkpoint_epoch_0002_step_x1.dtck", {1});
  std::vector<std::string> want;
  for (const std::string& name :
       {partial_checkpoint_file_name(3, 80), checkpoint_file_name(3),
        partial_checkpoint_file_name(2, 57), partial_checkpoint_file_name(2, 9),
        checkpoint_file_name(2)}) {
    want.push_back((dir_ / name).string());
  }
  EXPECT_EQ(list_checkpoints(dir_.string()), want);
}

TEST_F(CheckpointTest, RunIdsAreUnique) {
  const std::string a = new_run_id(), b = new_run_id();
  EXPECT_NE(a, b);
  EXPECT_EQ(a.size(), std::string("20261123T110600Z-").size() + 16) << a;
}

}  // namespace
}  // namespace dlaunch::ckpt
