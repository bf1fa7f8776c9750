// Where a run starts (train/resume.h), as pure decisions: which checkpoint --resume takes from a
// set of checkpoint files (newest first, some corrupt, of one run or several), when a --resume
// PATH is refused for another run's files, and the position a checkpoint's meta gives a world
// of some size and batch (skip the steps done, or go on with the permutation's untrained rest).
#include "worker/train/resume.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"

namespace dlaunch::train {
namespace {

using nlohmann::json;

ckpt::CheckpointFile valid_file(const std::string& path, const std::string& run_id) {
  ckpt::CheckpointFile f;
  f.path = path;
  f.valid = true;
  if (!run_id.empty()) f.meta["run_id"] = run_id;
  return f;
}

ckpt::CheckpointFile corrupt_file(const std::string& path) {
  ckpt::CheckpointFile f;
  f.path = path;
  f.error = "bad checksum";
  return f;
}

// The message of what `fn` throws as E; fails the test if it throws nothing or something else.
template <typename E, typename Fn>
std::string thrown(Fn fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "nothing of the expected type was thrown";
  return "";
}

TEST(CheckpointToResume, AFreshStartWhereThereIsNothingToResume) {
  EXPECT_EQ(checkpoint_to_resume("none", "out", {}), "");
  EXPECT_EQ(checkpoint_to_resume("auto", "out", {}), "");
}

TEST(CheckpointToResume, ResumeNoneAmongCheckpointsIsRefused) {
  const std::string msg = thrown<UsageError>([] {
    checkpoint_to_resume("none", "out", {valid_file("out/c2", "runA"), corrupt_file("out/c1")});
  });
  EXPECT_NE(msg.find("--resume none starts a new run"), std::string::npos) << msg;
  EXPECT_NE(msg.find("runA: 1 file, newest out/c2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(corrupt): 1 file"), std::string::npos) << msg;
}

TEST(CheckpointToResume, AutoTakesTheNewestValidFileOfTheRun) {
  const std::vector<ckpt::CheckpointFile> files = {
      corrupt_file("out/c3"), valid_file("out/c2", "runA"), valid_file("out/c1", "runA")};
  EXPECT_EQ(checkpoint_to_resume("auto", "out", files), "out/c2");
}

TEST(CheckpointToResume, FilesWithoutARunIdBelongToNoRun) {
  const std::vector<ckpt::CheckpointFile> files = {valid_file("out/c2", ""),
                                                   valid_file("out/c1", "runA")};
  EXPECT_EQ(checkpoint_to_resume("auto", "out", files), "out/c2");
}

TEST(CheckpointToResume, AutoAmongOnlyCorruptFilesIsRefused) {
  const std::string msg = thrown<ckpt::CheckpointError>([] {
    checkpoint_to_resume("auto", "out", {corrupt_file("out/c2"), corrupt_file("out/c1")});
  });
  EXPECT_NE(msg.find("holds 2 checkpoint(s) but none is valid"), std::string::npos) << msg;
  EXPECT_NE(msg.find("out/c1: bad checksum"), std::string::npos) << msg;
}

TEST(CheckpointToResume, AutoAmongTwoRunsIsRefused) {
  const std::string msg = thrown<UsageError>([] {
    checkpoint_to_resume("auto", "out",
                         {valid_file("out/c2", "runB"), valid_file("out/c1", "runA")});
  });
  EXPECT_NE(msg.find("holds checkpoints of 2 runs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("runB: 1 file, newest out/c2; runA: 1 file, newest out/c1"), std::string::npos)
      << msg;
}

TEST(CheckpointToResume, AnExplicitPathIsTakenAsGiven) {
  EXPECT_EQ(checkpoint_to_resume("/keep/c9", "out", {valid_file("out/c2", "runB")}), "/keep/c9");
  EXPECT_EQ(checkpoint_to_resume("/keep/c9", "out", {}), "/keep/c9");
}

TEST(RequireOneRun, AnotherRunsValidFileIsRefusedCorruptOnesAreNot) {
  const std::vector<ckpt::CheckpointFile> mine = {valid_file("out/c2", "runA"),
                                                  corrupt_file("out/c1")};
  EXPECT_NO_THROW(require_one_run("/keep/c9", "runA", "out", mine));
  const std::string msg = thrown<UsageError>(
      [] { require_one_run("/keep/c9", "", "out", {valid_file("out/c2", "runB")}); });
  EXPECT_NE(msg.find("--resume /keep/c9 continues run (no run id)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("runB: 1 file"), std::string::npos) << msg;
}

TEST(ResumePointOf, AnEpochBoundaryResumesAtTheNextEpoch) {
  const json meta = {{"epoch", 3},       {"step", 300},      {"world_size", 2},
                     {"batch_size", 64}, {"test_loss", 0.5}, {"test_accuracy", 0.9}};
  const ResumePoint p = resume_point_of(meta, 4, 32, 50000);
  EXPECT_EQ(p.epochs_done, 3);
  EXPECT_EQ(p.global_step, 300);
  EXPECT_EQ(p.test_loss, 0.5);
  EXPECT_EQ(p.test_accuracy, 0.9);
  EXPECT_EQ(p.saved_world_size, 2);
  EXPECT_EQ(p.inside_epoch.skip_steps, 0);
  EXPECT_EQ(p.inside_epoch.seen, 0);
  EXPECT_EQ(p.inside_epoch.totals.samples, 0);
}

TEST(ResumePointOf, WithoutAnEvaluationTheFiguresAreNaN) {
  const ResumePoint p = resume_point_of({{"epoch", 1}, {"step", 10}}, 1, 8, 100);
  EXPECT_TRUE(std::isnan(p.test_loss));
  EXPECT_TRUE(std::isnan(p.test_accuracy));
}

TEST(ResumePointOf, TheSameWorldAndBatchSkipTheStepsDone) {
  const json meta = {{"epoch", 2},       {"step", 205},     {"world_size", 2},
                     {"batch_size", 64}, {"epoch_step", 5}, {"epoch_totals", {12.5, 300, 640}}};
  const ResumePoint p = resume_point_of(meta, 2, 64, 50000);
  EXPECT_EQ(p.inside_epoch.skip_steps, 5);
  EXPECT_EQ(p.inside_epoch.seen, 0);
  EXPECT_EQ(p.inside_epoch.totals.loss_sum, 12.5);
  EXPECT_EQ(p.inside_epoch.totals.correct, 300);
  EXPECT_EQ(p.inside_epoch.totals.samples, 640);
}

TEST(ResumePointOf, AnotherWorldOrBatchGoesOnWithTheUntrainedRest) {
  const json meta = {{"epoch", 2},       {"step", 205},     {"world_size", 2},
                     {"batch_size", 64}, {"epoch_step", 5}, {"epoch_totals", {12.5, 300, 640}}};
  for (const auto& [world, batch] : {std::pair<int64_t, int64_t>{3, 64}, {2, 32}}) {
    const ResumePoint p = resume_point_of(meta, world, batch, 50000);
    EXPECT_EQ(p.inside_epoch.skip_steps, 0) << world << " x " << batch;
    EXPECT_EQ(p.inside_epoch.seen, 5 * 64 * 2) << world << " x " << batch;
    EXPECT_EQ(p.inside_epoch.totals.samples, 640);
  }
}

// After a shrink with --elastic_batch global the checkpoint records each rank's batch in use (not
// --batch_size) and the global batch kept: the position counts in the former.
TEST(ResumePointOf, AfterAShrinkTheBatchInUseCountsAndTheGlobalBatchIsRead) {
  const json meta = {{"epoch", 0},      {"step", 7},           {"world_size", 2},
                     {"batch_size", 16}, {"global_batch", 32}, {"epoch_step", 2},
                     {"epoch_seen_before", 64}};
  const ResumePoint p = resume_point_of(meta, 4, 8, 192);
  EXPECT_EQ(p.saved_batch_size, 16);
  EXPECT_EQ(p.saved_global_batch, 32);
  EXPECT_EQ(p.inside_epoch.seen, 64 + 2 * 16 * 2);
}

TEST(ResumePointOf, AnEpochThatBeganAfterAReformCountsFromItsPrefix) {
  json meta = {{"epoch", 0},       {"step", 40},      {"world_size", 2},
               {"batch_size", 10}, {"epoch_step", 3}, {"epoch_seen_before", 100}};
  ResumePoint p = resume_point_of(meta, 2, 10, 1000);
  EXPECT_EQ(p.inside_epoch.skip_steps, 0) << "the same world still cannot skip by steps";
  EXPECT_EQ(p.inside_epoch.seen, 100 + 3 * 10 * 2);
  EXPECT_EQ(p.inside_epoch.totals.samples, 0) << "no totals recorded: zeros";
  // Never the whole permutation: at least one sample is left to the epoch.
  p = resume_point_of(meta, 2, 10, 120);
  EXPECT_EQ(p.inside_epoch.seen, 119);
}

}  // namespace
}  // namespace dlaunch::train
