// Worker output through the real dlaunch binary: every byte a worker writes reaches the console
// and the log files once, in order, whatever the timing (issue: the end of a worker's output
// was lost, duplicated or reordered at exit, and long lines were cut in the files).
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::string kDlaunch = DLAUNCH_BIN;

std::string seq(int n) {
  std::string s;
  for (int i = 1; i <= n; ++i) s += std::to_string(i) + "\n";
  return s;
}

// The console lines of one local rank, prefix removed, joined with '\n'.
std::string console_of(const std::string& out, int local_rank) {
  std::string prefix = "[default" + std::to_string(local_rank) + "]:";
  std::string joined;
  for (const auto& line : lines_with_prefix(out, prefix)) joined += line.substr(prefix.size()) + "\n";
  return joined;
}

// The one file named `name` of local rank `lr` under --log_dir `dir` (the run id is random).
std::string log_file(const std::string& dir, int lr, const std::string& name) {
  for (const auto& run : fs::directory_iterator(dir)) {
    std::string path = run.path().string() + "/attempt_0/" + std::to_string(lr) + "/" + name;
    if (file_exists(path)) return read_file(path);
  }
  return "<no " + name + " for local rank " + std::to_string(lr) + " under " + dir + ">";
}

RunResult run_sh(const std::string& dir, int nproc, const std::string& script) {
  return run({kDlaunch, "--standalone", "--nproc_per_node", std::to_string(nproc), "--log_dir",
              dir, "--no_python", "sh", "-c", script},
             {}, 300s);
}

void expect_every_line(int n) {
  TempDir dir;
  auto r = run_sh(dir.path(), 1, "seq " + std::to_string(n));
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  std::string want = seq(n);
  EXPECT_TRUE(console_of(r.out, 0) == want) << "console lines differ from seq " << n;
  EXPECT_TRUE(log_file(dir.path(), 0, "stdout.log") == want) << "log file differs from seq " << n;
}

TEST(WorkerOutput, SeqOfHundredThousandLinesArrivesWholeOnConsoleAndInFile) {
  expect_every_line(100000);
}

TEST(WorkerOutput, SeqOfAMillionLinesArrivesWholeOnConsoleAndInFile) {
  expect_every_line(1000000);
}

TEST(WorkerOutput, FourWritersAtOnceEachKeepEveryLineInOrder) {
  TempDir dir;
  auto r = run_sh(dir.path(), 4, "seq 200000");
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  std::string want = seq(200000);
  for (int lr = 0; lr < 4; ++lr) {
    EXPECT_TRUE(console_of(r.out, lr) == want) << "local rank " << lr << " on the console";
    EXPECT_TRUE(log_file(dir.path(), lr, "stdout.log") == want) << "local rank " << lr << " file";
  }
}

TEST(WorkerOutput, BurstRightBeforeExitKeepsItsUnterminatedLastLine) {
  TempDir dir;
  auto r = run_sh(dir.path(), 1, "seq 50000; printf 'no newline at the end'");
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_TRUE(console_of(r.out, 0) == seq(50000) + "no newline at the end\n");
  EXPECT_TRUE(log_file(dir.path(), 0, "stdout.log") == seq(50000) + "no newline at the end");
}

TEST(WorkerOutput, WorkerKilledBySignalMidBurstKeepsWhatItWrote) {
  TempDir dir;
  auto r = run_sh(dir.path(), 1, "seq 100000; printf 'half a li'; kill -9 $$");
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(r.err.find("SIGKILL"), std::string::npos) << r.err;
  EXPECT_TRUE(console_of(r.out, 0) == seq(100000) + "half a li\n");
  EXPECT_TRUE(log_file(dir.path(), 0, "stdout.log") == seq(100000) + "half a li");
}

TEST(WorkerOutput, StderrTailInTheFailureReportKeepsTheUnterminatedLastLine) {
  TempDir dir;
  auto r = run_sh(dir.path(), 1, "printf 'Traceback (most recent call last):\\nValueError: boom' >&2; exit 3");
  EXPECT_EQ(r.exit.shell_code(), 1);
  EXPECT_NE(r.err.find("[default0]:ValueError: boom\n"), std::string::npos) << r.err;
  // The failure report's stderr tail quotes it too (after the console copy).
  EXPECT_NE(r.err.find("ValueError: boom", r.err.find("[default0]:ValueError: boom") + 30),
            std::string::npos)
      << r.err;
}

TEST(WorkerOutput, FiveMegabyteLineIsByteExactInTheFileAndCutVisiblyOnTheConsole) {
  TempDir dir;
  auto r = run_sh(dir.path(), 1, "head -c 5000000 /dev/zero | tr '\\0' x; echo; echo after");
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  std::string want = std::string(5000000, 'x') + "\nafter\n";
  EXPECT_TRUE(log_file(dir.path(), 0, "stdout.log") == want);
  auto pieces = lines_with_prefix(r.out, "[default0]:x");
  EXPECT_EQ(pieces.size(), 77u);  // ceil(5,000,000 / 65,536)
  size_t noted = 0, xs = 0;
  for (const auto& p : pieces) {
    noted += p.find("[dlaunch: line over 64 KiB, continues below]") != std::string::npos;
    xs += static_cast<size_t>(std::count(p.begin(), p.end(), 'x'));
  }
  EXPECT_EQ(noted, 76u);
  EXPECT_EQ(xs, 5000000u);
  EXPECT_EQ(lines_with_prefix(r.out, "[default0]:after").size(), 1u);
}

TEST(WorkerOutput, CarriageReturnUpdatesKeepTheRankPrefix) {
  TempDir dir;
  auto r = run_sh(dir.path(), 1, "printf '10%%\\r50%%\\r100%%\\n'");
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.out.find("[default0]:10%\r[default0]:50%\r[default0]:100%\n"), std::string::npos)
      << r.out;
  EXPECT_EQ(log_file(dir.path(), 0, "stdout.log"), "10%\r50%\r100%\n");
}

TEST(WorkerOutput, PartialLineShowsBeforeItsNewlineArrives) {
  TempDir dir;
  Subprocess p({kDlaunch, "--standalone", "--no_python", "sh", "-c",
                "printf 'continue? [y/n] '; sleep 20; echo answered"});
  // The prompt must show while the worker still waits (20 s), not when its line ends.
  bool shown = wait_until([&] { return p.out().find("[default0]:continue? [y/n] ") != std::string::npos; },
                          15s);
  EXPECT_TRUE(shown) << p.out();
  EXPECT_EQ(p.out().find("answered"), std::string::npos);
  p.signal(SIGINT);
  EXPECT_TRUE(p.wait(30s).has_value());
}

TEST(WorkerOutput, ConsoleTtyIsSaidOnlyWhenDlaunchWritesToATerminal) {
  // Through a pipe: not set.
  auto r = run({kDlaunch, "--standalone", "--no_python", "sh", "-c",
                "echo tty=${DLAUNCH_CONSOLE_TTY:-unset}"});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(lines_with_prefix(r.out, "[default0]:tty=unset").size(), 1u) << r.out;
  // On a pseudo-terminal (util-linux's script gives dlaunch one): set to 1.
  if (!file_exists("/usr/bin/script")) GTEST_SKIP() << "util-linux 'script' is not installed";
  r = run({"/usr/bin/script", "-qec",
           kDlaunch + " --standalone --no_python sh -c 'echo tty=${DLAUNCH_CONSOLE_TTY:-unset}'",
           "/dev/null"});
  ASSERT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.out.find("[default0]:tty=1"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dlaunch::testing
