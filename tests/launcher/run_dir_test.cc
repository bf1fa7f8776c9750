// Where a run's files go under --log_dir (launcher/config/run_dir.h): never into another run's directory.
#include "launcher/config/run_dir.h"
#include "launcher/config/config_resolution.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "common/error.h"

namespace dlaunch {
namespace {

class RunDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/dlaunch_run_dir_XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    base_ = templ;
  }
  void TearDown() override { std::filesystem::remove_all(base_); }
  std::string base_;
};

// Every job had the default run id "none" and so the same directory; each now gets its own.
TEST_F(RunDirTest, DefaultRunIdGetsAFreshDirectoryEachTime) {
  RunDir a = create_run_dir(base_ + "/logs", "none", false);
  RunDir b = create_run_dir(base_ + "/logs", "none", false);
  EXPECT_NE(a.path, b.path);
  for (const auto& d : {a, b}) {
    EXPECT_EQ(d.path.rfind(base_ + "/logs/none_", 0), 0u) << d.path;
    EXPECT_TRUE(std::filesystem::is_directory(d.path)) << d.path;
    EXPECT_TRUE(d.note.empty()) << d.note;
  }
}

TEST_F(RunDirTest, ANamedRunIdTakesItsNameOnceThenAFreshOneAndSaysSo) {
  RunDir first = create_run_dir(base_, "job7", true);
  EXPECT_EQ(first.path, base_ + "/job7");
  EXPECT_TRUE(first.note.empty());
  RunDir second = create_run_dir(base_, "job7", true);
  EXPECT_EQ(second.path.rfind(base_ + "/job7_", 0), 0u) << second.path;
  EXPECT_NE(second.note.find(base_ + "/job7 already exists"), std::string::npos) << second.note;
  EXPECT_NE(second.note.find(second.path), std::string::npos) << second.note;
}

TEST_F(RunDirTest, AnUnwritableLogDirIsAClearError) {
  std::string file = base_ + "/file";
  std::filesystem::create_directories(base_);
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  try {
    create_run_dir(file + "/logs", "none", false);
    FAIL() << "no error for a log dir under a file";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("give a writable --log_dir"), std::string::npos)
        << e.what();
  }
}

LaunchConfig resolve(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  auto lookup = [env](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  return resolve_config(parse_cli(args), lookup, HostInfo{8, 0, "feedfacecafebeef"});
}

TEST(RunIdNamedByUser, OnlyTheUsersOwnChoiceNamesTheDirectory) {
  EXPECT_TRUE(run_id_named_by_user(resolve({"--rdzv_id", "j", "p"})));
  EXPECT_TRUE(run_id_named_by_user(resolve({"--rdzv-id=j", "p"})));
  EXPECT_TRUE(run_id_named_by_user(resolve({"--standalone", "--rdzv_id", "j", "p"})));
  EXPECT_TRUE(run_id_named_by_user(resolve({"p"}, {{"DLAUNCH_RDZV_ID", "j"}})));
  EXPECT_TRUE(run_id_named_by_user(resolve({"p"}, {{"PET_RDZV_ID", "j"}})));
  EXPECT_FALSE(run_id_named_by_user(resolve({"p"})));                  // "none"
  EXPECT_FALSE(run_id_named_by_user(resolve({"--standalone", "p"})));  // random
  LaunchConfig slurm = resolve({"p"});
  slurm.origin["rdzv_id"] = "SLURM_JOB_ID";  // implied by the scheduler, not chosen
  EXPECT_FALSE(run_id_named_by_user(slurm));
  EXPECT_FALSE(run_id_named_by_user(LaunchConfig{}));
}

}  // namespace
}  // namespace dlaunch
