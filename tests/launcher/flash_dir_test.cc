// The job's flash directory (launcher/flash_dir.h): the size parser, the directory itself, and
// the real dlaunch binary giving it to workers, keeping it across a restart, removing it at the
// end and (through the orphan guard) after a SIGKILL of the agent. Workers are /bin/sh scripts.
#include "launcher/flash_dir.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::string kDlaunch = DLAUNCH_BIN;

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::vector<std::string> sh_job(std::vector<std::string> flags, const std::string& script) {
  std::vector<std::string> argv = {"/usr/bin/env", "--default-signal=HUP,INT,TERM,USR1,USR2",
                                   kDlaunch, "--standalone"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"/bin/sh", "-c", script});
  return argv;
}

// Writes `bytes` zero bytes to `path`; 0 or the errno of the first failed write.
int write_zeros(const std::string& path, int64_t bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return errno;
  std::vector<char> block(1 << 16, 0);
  int err = 0;
  for (int64_t done = 0; done < bytes && err == 0;) {
    ssize_t w = ::write(fd, block.data(), std::min<int64_t>(bytes - done, block.size()));
    if (w < 0) err = errno;
    else done += w;
  }
  ::close(fd);
  return err;
}

TEST(FlashLimit, ParsesBytesSuffixesAndPercentages) {
  const int64_t ram = int64_t{8} << 30;
  EXPECT_EQ(parse_flash_limit("0", "--flash_limit", ram), 0);
  EXPECT_EQ(parse_flash_limit("4096", "--flash_limit", ram), 4096);
  EXPECT_EQ(parse_flash_limit("512M", "--flash_limit", ram), int64_t{512} << 20);
  EXPECT_EQ(parse_flash_limit("2g", "--flash_limit", ram), int64_t{2} << 30);
  EXPECT_EQ(parse_flash_limit("1.5K", "--flash_limit", ram), 1536);
  EXPECT_EQ(parse_flash_limit("64MB", "--flash_limit", ram), int64_t{64} << 20);
  EXPECT_EQ(parse_flash_limit("25%", "--flash_limit", ram), int64_t{2} << 30);
  for (const char* bad : {"", "x", "-1", "12Q", "101%", "5MiBs", "nan"}) {
    try {
      parse_flash_limit(bad, "DLAUNCH_FLASH_LIMIT", ram);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("DLAUNCH_FLASH_LIMIT"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("expected"), std::string::npos) << e.what();
    }
  }
}

TEST(FlashDir, IsCreatedBoundedAndRemoved) {
  TempDir base;
  std::string path;
  {
    FlashDir d = FlashDir::create(base.path(), "run/with odd:chars", int64_t{4} << 20);
    path = d.path();
    ASSERT_TRUE(fs::is_directory(path)) << path;
    EXPECT_EQ(fs::path(path).filename().string().rfind("dlaunch_flash_run_with_odd_chars_", 0), 0u)
        << path;
    EXPECT_EQ(write_zeros(path + "/small", 1 << 20), 0);
    if (!d.enforced()) {
      GTEST_SKIP() << "this process may not mount a tmpfs (no CAP_SYS_ADMIN): the limit is not "
                      "enforced here, so there is nothing to check";
    }
    EXPECT_EQ(write_zeros(path + "/big", int64_t{8} << 20), ENOSPC);
    FlashDir moved = std::move(d);
    EXPECT_TRUE(d.path().empty());
    EXPECT_EQ(moved.path(), path);
  }
  EXPECT_FALSE(fs::exists(path)) << path;
}

// One job: attempt 0 leaves a file and fails; attempt 1 (a restart) must find it. Then the job
// ends and the directory is gone.
TEST(FlashDirJob, KeptAcrossARestartAndRemovedAtTheEnd) {
  TempDir dir;
  const std::string script =
      "echo \"$DLAUNCH_FLASH_DIR\" > " + dir.file("flash") +
      "; if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then echo state-of-attempt-0 > "
      "\"$DLAUNCH_FLASH_DIR/state\"; exit 3; fi; cat \"$DLAUNCH_FLASH_DIR/state\" > " +
      dir.file("seen");
  auto r = run(sh_job({"--max_restarts", "1"}, script), {}, 60s);
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  const std::string flash = trim(read_file(dir.file("flash")));
  ASSERT_EQ(flash.rfind("/dev/shm/dlaunch_flash_", 0), 0u) << flash;
  EXPECT_EQ(trim(read_file(dir.file("seen"))), "state-of-attempt-0");
  EXPECT_FALSE(fs::exists(flash)) << flash << " outlived its job";
}

TEST(FlashDirJob, NoneWithLimitZero) {
  auto r = run(sh_job({"--flash_limit", "0"}, "echo \"flash=[${DLAUNCH_FLASH_DIR-unset}]\""), {}, 60s);
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.out.find("flash=[unset]"), std::string::npos) << r.out;
}

TEST(FlashDirJob, WriteBeyondTheLimitFailsWithEnospcInTheWorker) {
  TempDir probe;
  if (!FlashDir::create(probe.path(), "probe", 1 << 20).enforced()) {
    GTEST_SKIP() << "dlaunch may not mount a tmpfs here (no CAP_SYS_ADMIN): the limit is "
                    "documented as not enforced";
  }
  // 8 MiB into a 4 MiB directory: dd must fail with ENOSPC; the job reports dd's status.
  auto r = run(sh_job({"--flash_limit", "4M"},
                      "dd if=/dev/zero of=\"$DLAUNCH_FLASH_DIR/big\" bs=1M count=8 2>&1; echo dd=$?"),
               {}, 60s);
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.out.find("dd=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("No space left on device"), std::string::npos) << r.out;
}

TEST(FlashDirJob, RemovedWhenTheAgentIsSigkilled) {
  TempDir dir;
  Subprocess p(sh_job({"--nproc_per_node", "2"},
                      "echo \"$DLAUNCH_FLASH_DIR\" > " + dir.file("flash") +
                          ".$LOCAL_RANK; mkdir -p \"$DLAUNCH_FLASH_DIR/sub/deeper\"; echo x > "
                          "\"$DLAUNCH_FLASH_DIR/sub/deeper/rank$LOCAL_RANK\"; touch " +
                          dir.file("ready") + ".$LOCAL_RANK; exec sleep 300"));
  ASSERT_TRUE(wait_until([&] { return file_exists(dir.file("ready.0")) && file_exists(dir.file("ready.1")); },
                         30s))
      << p.err();
  const std::string flash = trim(read_file(dir.file("flash.0")));
  ASSERT_FALSE(flash.empty());
  ASSERT_TRUE(fs::exists(flash + "/sub/deeper/rank1"));
  p.signal(SIGKILL);
  ASSERT_TRUE(p.wait(30s));
  EXPECT_TRUE(wait_until([&] { return !fs::exists(flash); }, 20s))
      << flash << " outlived a SIGKILLed agent";
}

// Without --log_dir the workers' files go to a temporary run directory, removed at a clean end
// and kept (and named) after a failure; an agent killed outright can do neither, so the orphan
// guard removes it (a chaos soak found 25 of them left in $TMPDIR).
TEST(FlashDirJob, TemporaryRunDirectoryGoesWithASigkilledAgent) {
  TempDir tmp, dir;
  std::vector<std::string> argv = sh_job({"--nproc_per_node", "1"},
                                         "touch " + dir.file("ready") + "; exec sleep 300");
  argv.insert(argv.begin() + 1, "TMPDIR=" + tmp.path());
  Subprocess p(argv);
  ASSERT_TRUE(wait_until([&] { return file_exists(dir.file("ready")); }, 30s)) << p.err();
  auto run_dirs = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(tmp.path())) {
      n += e.path().filename().string().rfind("dlaunch_", 0) == 0;
    }
    return n;
  };
  ASSERT_EQ(run_dirs(), 1) << "the run directory is made under $TMPDIR";
  p.signal(SIGKILL);
  ASSERT_TRUE(p.wait(30s));
  EXPECT_TRUE(wait_until([&] { return run_dirs() == 0; }, 20s))
      << "a temporary run directory outlived a SIGKILLed agent";
}

}  // namespace
}  // namespace dlaunch::testing
