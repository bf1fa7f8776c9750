// The job's flash directory (launcher/flash/flash_dir.h): the size parser, the directory itself, and
// the real dlaunch binary giving it to workers, keeping it across a restart, removing it at the
// end and (through the orphan guard) after a SIGKILL of the agent, and the next dlaunch sweeping
// one whose agent and guard were killed together (flash_sweep.h). Workers are /bin/sh scripts.
#include "launcher/flash/flash_dir.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "launcher/flash/flash_sweep.h"
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
  std::vector<std::string> argv = {kDlaunch, "--standalone"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"/bin/sh", "-c", script});
  return with_default_signals(std::move(argv));
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

// A worker asks for its flash state to be kept (.persist_to): a job that fails leaves it on
// disk, where the worker's resume looks (cached data and dot files excepted, files already
// there untouched); a job that succeeds keeps nothing.
TEST(FlashDirJob, StateAskedForIsWrittenToDiskWhenTheJobDoesNotSucceed) {
  for (int code : {3, 0}) {
    TempDir dir;
    const std::string out = dir.file("out");
    fs::create_directories(out);
    { std::ofstream(out + "/older.ckpt") << "on disk already"; }
    const std::string script =
        "d=\"$DLAUNCH_FLASH_DIR/w\"; mkdir -p \"$d\" && echo " + out +
        " > \"$d/.persist_to\" && echo state-at-step-9 > \"$d/step_9.ckpt\" && echo cached > "
        "\"$d/data_123.bin\" && echo flash > \"$d/older.ckpt\"; exit " +
        std::to_string(code);
    auto r = run(sh_job({}, script), {}, 60s);
    ASSERT_EQ(r.exit.shell_code(), code == 0 ? 0 : 1) << r.err;
    EXPECT_EQ(trim(read_file(out + "/older.ckpt")), "on disk already");
    EXPECT_FALSE(fs::exists(out + "/data_123.bin"));
    EXPECT_FALSE(fs::exists(out + "/.persist_to"));
    if (code == 0) {
      EXPECT_FALSE(fs::exists(out + "/step_9.ckpt")) << "a success keeps nothing";
      continue;
    }
    EXPECT_EQ(trim(read_file(out + "/step_9.ckpt")), "state-at-step-9") << r.err;
    EXPECT_NE(r.err.find("kept the workers' flash state " + out + "/step_9.ckpt"),
              std::string::npos)
        << r.err;
  }
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

// The owner record decides: a directory whose owner lives stays, one whose recorded owner is
// gone (or whose pid now names another process) goes, one without a record stays.
TEST(FlashSweep, RemovesOnlyDirectoriesWhoseOwnersAreGone) {
  TempDir base;
  auto make = [&](const std::string& name) {
    std::string d = base.file("dlaunch_flash_" + name);
    fs::create_directories(d + "/dtrain");
    write_zeros(d + "/dtrain/state", 4096);
    return d;
  };
  const std::string live = make("live_a"), reused = make("reused_b"), bare = make("bare_c");
  const std::string other = base.file("not_flash");
  fs::create_directories(other);
  ASSERT_TRUE(write_flash_owner(live, ::getpid(), ::getpid(), "live run"));
  ASSERT_TRUE(write_flash_owner(reused, ::getpid(), ::getpid(), "reused"));
  ASSERT_TRUE(write_flash_owner(other, ::getpid(), ::getpid(), "other"));
  // Our pid with another start time: what a pid reused after the owner died looks like.
  std::string record = read_file(reused + "/" + kFlashOwnerFile);
  for (const char* key : {"\nagent ", "\nguard "}) {
    size_t at = record.find(key);
    ASSERT_NE(at, std::string::npos) << record;
    size_t start = record.find(' ', at + std::strlen(key)) + 1;
    record.insert(start, "9");  // a start time that is not our process's
  }
  {
    std::ofstream(reused + "/" + kFlashOwnerFile, std::ios::trunc) << record;
  }
  EXPECT_NE(read_file(live + "/" + kFlashOwnerFile).find("run live_run"), std::string::npos);

  auto removed = sweep_stale_flash_dirs(base.path());
  EXPECT_EQ(removed, std::vector<std::string>{reused});
  EXPECT_FALSE(fs::exists(reused));
  EXPECT_TRUE(fs::exists(live + "/dtrain/state")) << "a live owner's directory was touched";
  EXPECT_TRUE(fs::exists(bare + "/dtrain/state")) << "a directory without a record was touched";
  EXPECT_TRUE(fs::exists(other)) << "only dlaunch_flash_* directories are swept";
}

// The real thing: a job's agent and orphan guard SIGKILLed together leave the flash directory
// (mounted, where dlaunch may mount); the next dlaunch on the host removes it and says so.
// `prefix` runs the first job in a mount namespace of its own (as `ip netns exec` does): its
// tmpfs is then not visible here, only the directory beneath it.
void sweep_after_agent_and_guard_die(const std::vector<std::string>& prefix) {
  TempDir dir;
  std::vector<std::string> argv = prefix;
  for (auto& a : sh_job({"--nproc_per_node", "1"},
                        "echo \"$DLAUNCH_FLASH_DIR\" > " + dir.file("flash") +
                            "; echo x > \"$DLAUNCH_FLASH_DIR/rank0\"; touch " + dir.file("ready") +
                            "; exec sleep 300")) {
    argv.push_back(a);
  }
  Subprocess p(argv);
  ASSERT_TRUE(wait_until([&] { return file_exists(dir.file("ready")); }, 30s)) << p.err();
  const std::string flash = trim(read_file(dir.file("flash")));
  ASSERT_EQ(flash.rfind(std::string(kFlashBase) + "/dlaunch_flash_", 0), 0u) << flash;
  // The owner record names the agent and its guard.
  std::istringstream record(read_file(flash + "/" + kFlashOwnerFile));
  std::string line, key;
  pid_t agent = 0, guard = 0;
  while (std::getline(record, line)) {
    std::istringstream words(line);
    words >> key;
    if (key == "agent") words >> agent;
    if (key == "guard") words >> guard;
  }
  ASSERT_EQ(agent, p.pid()) << read_file(flash + "/" + kFlashOwnerFile);
  ASSERT_GT(guard, 0);
  // The guard first, so nothing is left to clean up after the agent.
  ASSERT_EQ(::kill(guard, SIGKILL), 0);
  // Dead once gone or a zombie: the agent never reaps its guard before its own clean exit.
  auto dead = [](pid_t pid) {
    std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    size_t close = stat.rfind(')');
    return close == std::string::npos || stat.compare(close, 3, ") Z") == 0;
  };
  ASSERT_TRUE(wait_until([&] { return dead(guard); }, 10s)) << "the guard did not die";
  p.signal(SIGKILL);
  ASSERT_TRUE(p.wait(30s));
  ASSERT_TRUE(fs::exists(flash)) << "nothing should have removed it yet";

  auto r = run(sh_job({"--flash_limit", "0"}, "true"), {}, 60s);
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_FALSE(fs::exists(flash)) << flash << " was not swept; dlaunch said:\n" << r.err;
  EXPECT_NE(r.err.find("removed the stale flash directory " + flash), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("pid " + std::to_string(agent)), std::string::npos) << r.err;
}

TEST(FlashDirJob, LeftByAKilledAgentAndGuardIsSweptAtTheNextStart) {
  sweep_after_agent_and_guard_die({});
}

TEST(FlashDirJob, LeftInAnotherMountNamespaceIsSweptToo) {
  const std::vector<std::string> unshare = {"/usr/bin/unshare", "--mount", "--propagation",
                                            "private"};
  std::vector<std::string> probe = unshare;
  probe.push_back("true");
  if (!file_exists(unshare[0]) || run(probe, {}, 30s).exit.shell_code() != 0) {
    GTEST_SKIP() << "cannot make a mount namespace here (needs root and util-linux's unshare)";
  }
  sweep_after_agent_and_guard_die(unshare);
}

}  // namespace
}  // namespace dlaunch::testing
