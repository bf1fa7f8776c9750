// The real process context's descendant handling with real processes: exited orphans are reaped
// and a clean teardown needs no /proc scan (the kernel says "no child left": the orphan guard is
// a clone child, invisible to waitid), while orphans that left the workers' process groups are
// still found and killed at teardown, with everything they started.
//
// Found by bench/agents (docs/benchmarks.md, "Agents at scale"): every agent read every process's
// /proc/<pid>/stat on each SIGCHLD and each teardown; with 1,024 agents on one host that made
// the last worker start 45 s after the first.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "launcher/process/posix_process_context.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

class TempFile {
 public:
  TempFile() {
    char templ[] = "/tmp/orphan_sweep_XXXXXX";
    int fd = mkstemp(templ);
    if (fd >= 0) ::close(fd);
    path_ = templ;
    std::remove(path_.c_str());
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

bool alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// Runs `script` under /bin/sh as a worker and the loop until it exits; returns its status.
std::optional<ExitStatus> run_worker(boost::asio::io_context& io, PosixProcessContext& procs,
                                     const std::string& script, bool kill_group = true) {
  SpawnRequest req;
  req.argv = {"/bin/sh", "-c", script};
  req.env = {{"PATH", "/usr/bin:/bin"}};
  std::optional<ExitStatus> status;
  ProcessCallbacks cb;
  cb.on_exit = [&](const ExitStatus& st) { status = st; };
  int pid = procs.spawn(req, std::move(cb));
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!status && std::chrono::steady_clock::now() < deadline) io.run_one_for(100ms);
  if (kill_group) procs.signal_group(pid, SIGKILL);  // what the agent does once they are done
  return status;
}

std::vector<pid_t> read_pids(const std::string& path) {
  std::ifstream in(path);
  std::vector<pid_t> pids;
  pid_t p;
  while (in >> p) pids.push_back(p);
  return pids;
}

int children_left() {
  siginfo_t info{};
  if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return errno == ECHILD ? 0 : -1;
  return 1;
}

TEST(OrphanSweep, TheGuardIsNotAChildThatWaitidSees) {
  boost::asio::io_context io;
  PosixProcessContext procs(io);
  // Only the guard is our child now, and waitid does not count it.
  EXPECT_EQ(children_left(), 0);
}

TEST(OrphanSweep, CleanTeardownReadsNoProc) {
  boost::asio::io_context io;
  PosixProcessContext procs(io);
  auto st = run_worker(io, procs, "exit 0");
  ASSERT_TRUE(st);
  EXPECT_TRUE(st->success()) << st->describe();
  // What the agent does after a success: look for what the workers left (nothing), then sweep.
  EXPECT_TRUE(
      procs.signal_leftovers(SIGTERM, [] { FAIL() << "on_gone with nothing left"; }).empty());
  EXPECT_TRUE(procs.kill_orphans(3s).empty());
  EXPECT_EQ(procs.proc_scans(), 0);
}

// The real context's side of what successful workers leave running: found, named, signalled
// through a pidfd, and watched on the loop until it exits (no polling).
TEST(OrphanSweep, LeftoversOfASuccessfulWorkerAreSignalledAndWatched) {
  boost::asio::io_context io;
  PosixProcessContext procs(io);
  TempFile file;
  std::string script = "sh -c 'trap \"exit 0\" TERM; echo $$ > " + file.path() +
                       ".tmp; mv " + file.path() + ".tmp " + file.path() +
                       "; while :; do sleep 0.05; done' & "
                       "while [ ! -s " + file.path() + " ]; do sleep 0.01; done; exit 0";
  // After a success the agent looks for leftovers before it SIGKILLs the workers' groups.
  auto st = run_worker(io, procs, script, false);
  ASSERT_TRUE(st);
  std::vector<pid_t> pids = read_pids(file.path());
  ASSERT_EQ(pids.size(), 1u);
  bool gone = false;
  auto left = procs.signal_leftovers(SIGTERM, [&] { gone = true; });
  ASSERT_FALSE(left.empty());
  std::string names;
  for (const auto& l : left) names += l + "; ";
  EXPECT_NE(names.find("pid " + std::to_string(pids[0]) + " (sh -c trap"), std::string::npos)
      << names;
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!gone && std::chrono::steady_clock::now() < deadline) io.run_one_for(100ms);
  EXPECT_TRUE(gone) << "on_gone did not run after the leftovers exited";
  EXPECT_TRUE(procs.live_leftovers().empty());
  EXPECT_TRUE(procs.kill_orphans(3s).empty());
  EXPECT_FALSE(alive(pids[0]));
}

TEST(OrphanSweep, ExitedOrphansAreReapedWithoutProc) {
  boost::asio::io_context io;
  PosixProcessContext procs(io);
  // The worker leaves a child behind: reparented to us (a subreaper), then killed with the
  // worker's group (run_worker does what the agent does), it must not stay a zombie.
  auto st = run_worker(io, procs, "(sleep 0.2; exit 0) & exit 0");
  ASSERT_TRUE(st);
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (children_left() != 0 && std::chrono::steady_clock::now() < deadline) {
    procs.reap_orphan_zombies();
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(children_left(), 0) << "an exited orphan was not reaped";
  EXPECT_EQ(procs.proc_scans(), 0);
}

TEST(OrphanSweep, OrphanTreeOutsideTheGroupIsKilledAtTeardown) {
  boost::asio::io_context io;
  PosixProcessContext procs(io);
  TempFile file;
  // A daemon-like child: leaves the worker's group and session (setsid), starts two children of
  // its own, writes the three pids. The worker exits once the pids are written.
  std::string script =
      "setsid /bin/sh -c 'sleep 300 & a=$!; sleep 300 & echo $$ $a $! > " + file.path() +
      ".tmp; mv " + file.path() + ".tmp " + file.path() + "; wait' & "
      "i=0; while [ ! -s " + file.path() + " ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done";
  auto st = run_worker(io, procs, script);
  ASSERT_TRUE(st);
  std::vector<pid_t> pids = read_pids(file.path());
  ASSERT_EQ(pids.size(), 3u);
  for (pid_t p : pids) ASSERT_TRUE(alive(p)) << p;
  auto stuck = procs.kill_orphans(5s);
  EXPECT_TRUE(stuck.empty()) << stuck.front();
  // Gone and reaped: the sweep waits for them, so nothing is left when it returns.
  for (pid_t p : pids) EXPECT_FALSE(alive(p)) << "pid " << p << " survived the sweep";
  EXPECT_EQ(children_left(), 0);
  EXPECT_GE(procs.proc_scans(), 1);
}

}  // namespace
}  // namespace dlaunch
