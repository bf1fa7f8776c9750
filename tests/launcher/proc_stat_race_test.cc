// Found by bench/agents (docs/benchmarks.md, "Agents at scale"): reading /proc/<pid>/stat
// through an std::ifstream throws when the process is reaped between the open and the read
// (read() fails with ESRCH, and libstdc++'s filebuf throws whatever the exception mask). The
// orphan sweep reads every process on the host, so a process exiting anywhere during a sweep
// killed the agent ("basic_filebuf::underflow error reading the file: No such process").
//
// This test races process_state() (the public entry to the same read) against children being
// reaped by another thread.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <string>
#include <thread>

#include "launcher/process/posix_process_context.h"

namespace dlaunch {
namespace {

TEST(ProcStatRace, ProcessStateOfAProcessReapedMidReadDoesNotThrow) {
  boost::asio::io_context io;
  PosixProcessContext procs(io);
  int threw = 0;
  std::string what;
  for (int i = 0; i < 300 && threw == 0; ++i) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(0);
    std::atomic<bool> go{false};
    std::thread reaper([&] {
      while (!go.load()) {
      }
      waitpid(pid, nullptr, 0);
    });
    go = true;
    // Until the pid is gone: "" once reaped. Each call opens, then reads; the reaper's
    // waitpid lands between the two in some iterations.
    for (int k = 0; k < 100000; ++k) {
      try {
        if (procs.process_state(pid).empty()) break;
      } catch (const std::exception& e) {
        ++threw;
        what = e.what();
        break;
      }
    }
    reaper.join();
  }
  EXPECT_EQ(threw, 0) << "process_state() threw for a process reaped during the read: " << what;
}

}  // namespace
}  // namespace dlaunch
