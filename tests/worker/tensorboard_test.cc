// dtrain's TensorBoard event files: the TFRecord framing and the scalars of a record (pure
// logic), then real dtrain runs read back by the tensorboard package's own readers (the venv of
// PyTorch 2.x, DLAUNCH_TORCH2_PYTHON, which pins tensorboard): every scalar equals metrics.jsonl's,
// and after a crash, garbage at the file's tail and a resume (or a flash restart under dlaunch),
// each step is there once, with the value of the line that survived. Those tests skip, saying
// why, without the venv or tensorboard.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"
#include "worker/metrics/tensorboard_log.h"
#include "worker/metrics/tf_record.h"

namespace dlaunch {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using testing::Subprocess;
using testing::TempDir;

TEST(TfRecordTest, Crc32cAndFrameMatchTensorFlows) {
  // The CRC-32C check value of the standard test string (RFC 3720, B.4).
  const std::string check = "123456789";
  EXPECT_EQ(metrics::crc32c(check.data(), check.size()), 0xE3069283u);
  // TensorFlow's own record of these 3 bytes (tensorflow/core/lib/io/record_writer.cc framing):
  // length 3 little-endian, its masked CRC, the data, the data's masked CRC.
  const std::string framed = metrics::frame_tf_record("abc");
  ASSERT_EQ(framed.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(framed.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(framed.substr(12, 3), "abc");
  auto le32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(framed[at + i]);
    return v;
  };
  const uint32_t crc = metrics::crc32c("abc", 3);
  EXPECT_EQ(le32(15), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  EXPECT_EQ(le32(8), metrics::masked_crc32c(framed.data(), 8));
}

TEST(TensorBoardScalarsTest, EveryNumberOfStepAndEpochRecordsButStepAttemptAndTime) {
  const json step = {{"kind", "step"}, {"step", 7},   {"loss", 2.5},     {"lr", 0.1},
                     {"attempt", 1},   {"time", 1e9}, {"world_size", 2}, {"complete", true}};
  const auto scalars = metrics::tensorboard_scalars(step);
  const std::map<std::string, double> got(scalars.begin(), scalars.end());
  EXPECT_EQ(got, (std::map<std::string, double>{
                     {"step/loss", 2.5}, {"step/lr", 0.1}, {"step/world_size", 2}}));
  EXPECT_TRUE(metrics::tensorboard_scalars({{"kind", "start"}, {"step", 4}}).empty());
  EXPECT_TRUE(metrics::tensorboard_scalars({{"kind", "data"}, {"classes", 10}}).empty());
}

// The scalars of metrics.jsonl's surviving lines, as the test itself reads the file: for each
// kind and step the last line written (a step redone after a resume comes later), every number
// in it but the step, the attempt and the time. Key: (tag, step); value: (value, time).
using Expected = std::map<std::pair<std::string, int64_t>, std::pair<double, double>>;
Expected expected_scalars(const fs::path& metrics) {
  Expected out;
  std::map<std::pair<std::string, int64_t>, json> last;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (j["kind"] == "step" || j["kind"] == "epoch") last[{j["kind"], j["step"]}] = j;
  }
  for (const auto& [key, j] : last) {
    for (const auto& [field, value] : j.items()) {
      if (field == "step" || field == "attempt" || field == "time" || !value.is_number()) continue;
      out[{key.first + "/" + field, key.second}] = {value.get<double>(), j["time"].get<double>()};
    }
  }
  return out;
}

// The values were written as floats (TensorBoard's simple_value).
bool float_equal(double got, double want) {
  return std::fabs(got - want) <= 1e-6 * std::max(1.0, std::fabs(want));
}

class DtrainTensorBoardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kPython)) {
      GTEST_SKIP() << "no " << kPython << " (the PyTorch 2.x venv that holds tensorboard): run "
                   << "scripts/setup_torch2.sh, or configure with -DDLAUNCH_TORCH2_PYTHON=<python "
                   << "with tensorboard>";
    }
    Subprocess probe({kPython, "-c", "import tensorboard"});
    auto e = probe.wait(std::chrono::seconds(120));
    if (!e || e->shell_code() != 0) {
      GTEST_SKIP() << kPython << " cannot import tensorboard: run scripts/setup_torch2.sh (it pins "
                   << "tensorboard in scripts/torch2-requirements.txt)\n"
                   << probe.err();
    }
    out_ = fs::path(dir_.path()) / "out";
  }

  // A tiny run: 128 samples in batches of 32 = 4 steps per epoch, a metrics line every step.
  int run_dtrain(const std::vector<std::string>& extra,
                 std::map<std::string, std::string> env = {}) {
    std::vector<std::string> argv = {DTRAIN_BINARY, "--width=4", "--batch_size=32", "--log_every=1",
                                     "--output_dir=" + out_.string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    env.insert({{"DTRAIN_LIMIT_TRAIN_SAMPLES", "128"},
                {"DTRAIN_LIMIT_TEST_SAMPLES", "32"},
                {"OMP_NUM_THREADS", "1"},
                {"DLAUNCH_CONV_CACHE", "off"}});
    Subprocess p(argv, env);
    auto e = p.wait(std::chrono::seconds(300));
    last_log_ = p.out() + p.err();
    return e ? e->shell_code() : -1;
  }

  json read_back() {
    Subprocess p({kPython, TENSORBOARD_SCALARS_SCRIPT, out_.string()});
    auto e = p.wait(std::chrono::seconds(300));
    EXPECT_TRUE(e && e->shell_code() == 0) << p.err();
    json j = json::parse(p.out(), nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(j.is_object()) << p.out() << p.err();
    return j;
  }

  // Every scalar TensorBoard reads equals metrics.jsonl's surviving line, each (tag, step) once,
  // and nothing else is there.
  void expect_same_as_metrics(const json& got) {
    const Expected want = expected_scalars(out_ / "metrics.jsonl");
    ASSERT_FALSE(want.empty());
    std::set<std::pair<std::string, int64_t>> seen;
    for (const json& e : got["events"]) {
      const std::pair<std::string, int64_t> key{e[0], e[1]};
      EXPECT_TRUE(seen.insert(key).second) << key.first << " at step " << key.second << " twice";
      auto it = want.find(key);
      if (it == want.end()) {
        ADD_FAILURE() << key.first << " at step " << key.second << " is not in metrics.jsonl";
        continue;
      }
      EXPECT_TRUE(float_equal(e[2], it->second.first))
          << key.first << " at step " << key.second << ": " << e[2] << " vs " << it->second.first;
      EXPECT_NEAR(e[3].get<double>(), it->second.second, 1e-6) << key.first << " at " << key.second;
    }
    EXPECT_EQ(seen.size(), want.size()) << "scalars of metrics.jsonl missing from the event file";
    // TensorBoard's accumulator over the directory sees the same points.
    size_t points = 0;
    for (const auto& [tag, series] : got["accumulator"].items()) {
      for (const json& p : series) {
        ++points;
        auto it = want.find({tag, p[0].get<int64_t>()});
        ASSERT_NE(it, want.end()) << tag << " at step " << p[0];
        EXPECT_TRUE(float_equal(p[1], it->second.first)) << tag << " at step " << p[0];
      }
    }
    EXPECT_EQ(points, want.size());
  }

  static constexpr const char* kPython = DLAUNCH_TORCH2_PYTHON;
  TempDir dir_;
  fs::path out_;
  std::string last_log_;
};

TEST_F(DtrainTensorBoardTest, EventFileHoldsEveryScalarOfMetricsJsonl) {
  ASSERT_EQ(run_dtrain({"--epochs=2"}), 0) << last_log_;
  const json got = read_back();
  ASSERT_EQ(got["files"].size(), 1u) << got["files"];
  expect_same_as_metrics(got);
  // What users look for is there, per logged step and per epoch.
  for (const char* tag : {"step/loss", "step/train_accuracy", "step/lr", "step/images_per_s",
                          "epoch/loss", "epoch/train_accuracy", "epoch/test_loss",
                          "epoch/test_accuracy", "epoch/lr", "epoch/images_per_s"}) {
    EXPECT_TRUE(got["accumulator"].contains(tag)) << tag;
  }
  EXPECT_EQ(got["accumulator"]["step/loss"].size(), 8u);
  EXPECT_EQ(got["accumulator"]["epoch/test_accuracy"].size(), 2u);

  // Turned off, a new run writes none.
  ASSERT_EQ(run_dtrain({"--epochs=1", "--overwrite", "--tensorboard=false"}), 0) << last_log_;
  for (const auto& entry : fs::directory_iterator(out_)) {
    EXPECT_EQ(entry.path().filename().string().find("tfevents"), std::string::npos)
        << entry.path() << ": --overwrite deletes the old run's event file, and none is written";
  }
}

// A run killed in its second epoch (after the epoch-1 checkpoint at step 4, so steps 5 and 6 are
// lost), its event file's tail then torn by garbage, resumed: the reader skips the tail, dtrain
// resumes without noticing it, and the redone steps 5 and 6 are in the event file once each, with
// the resumed run's values and times.
TEST_F(DtrainTensorBoardTest, KilledRunWithGarbageTailResumesWithEachStepOnce) {
  ASSERT_EQ(run_dtrain({"--epochs=2"}, {{"DTRAIN_FAIL_AT_STEP", "6"}}), 128 + 9) << last_log_;
  json got = read_back();
  ASSERT_EQ(got["files"].size(), 1u) << got["files"];
  const fs::path events = out_ / got["files"][0].get<std::string>();
  {
    std::ofstream tail(events, std::ios::app | std::ios::binary);
    // A length that promises 42 bytes, then no valid CRC.
    const std::string garbage =
        std::string("\x2a\0\0\0\0\0\0\0", 8) + " not a TFRecord: a write torn by a crash";
    tail.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  }
  got = read_back();
  expect_same_as_metrics(got);
  EXPECT_EQ(got["accumulator"]["step/loss"].size(), 6u)
      << "the records before the garbage are read";

  ASSERT_EQ(run_dtrain({"--epochs=2"}), 0) << last_log_;
  EXPECT_NE(last_log_.find("resum"), std::string::npos) << last_log_;
  got = read_back();
  ASSERT_EQ(got["files"].size(), 1u) << "the old event file is replaced: " << got["files"];
  expect_same_as_metrics(got);
  EXPECT_EQ(got["accumulator"]["step/loss"].size(), 8u);
  EXPECT_EQ(got["accumulator"]["epoch/loss"].size(), 2u);
}

// Under dlaunch, rank 1 killed after step 11 of 16: the group restarts from the flash copy at
// step 9 (--restart_scope group: a rank replaced alone redoes nothing) and redoes steps 10 and
// 11 (metrics.jsonl has them twice, told apart by the attempt). Rank 0 alone writes the event
// file, which has each of them once, with attempt 1's values.
TEST_F(DtrainTensorBoardTest, FlashRestartUnderDlaunchKeepsEachStepOnce) {
  Subprocess p({DLAUNCH_BINARY, "--standalone", "--nproc_per_node=2", "--max_restarts=1",
                "--hang_timeout=120", "--restart_scope=group", DTRAIN_BINARY, "--width=4",
                "--batch_size=32", "--epochs=2",
                "--log_every=1", "--flash_every=3", "--output_dir=" + out_.string()},
               {{"DTRAIN_LIMIT_TRAIN_SAMPLES", "512"},
                {"DTRAIN_LIMIT_TEST_SAMPLES", "32"},
                {"DTRAIN_FAIL_AT_STEP", "11"},
                {"DTRAIN_FAIL_RANK", "1"},
                {"OMP_NUM_THREADS", "1"},
                {"DLAUNCH_CONV_CACHE", "off"}});
  auto e = p.wait(std::chrono::seconds(300));
  const std::string log = p.out() + p.err();
  ASSERT_TRUE(e && e->shell_code() == 0) << log;
  ASSERT_NE(log.find("fault injection: killing rank 1 after step 11"), std::string::npos) << log;
  int step_lines = 0;
  std::ifstream in(out_ / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) step_lines += json::parse(line)["kind"] == "step";
  ASSERT_EQ(step_lines, 18) << "16 steps, 10 and 11 twice";

  const json got = read_back();
  ASSERT_EQ(got["files"].size(), 1u) << got["files"];
  expect_same_as_metrics(got);
  EXPECT_EQ(got["accumulator"]["step/loss"].size(), 16u);
}

}  // namespace
}  // namespace dlaunch
