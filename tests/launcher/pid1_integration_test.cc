// dlaunch as PID 1 of a PID namespace, as a container without an init runs it: it reaps every
// orphan that comes to it while the job runs, a SIGTERM from outside ends the job within the
// grace with 143 (also before the agent runs), and a second stop signal skips the grace.
// The kernel drops a signal to PID 1 that has no handler, so each of these also checks that a
// handler is in place when it matters. Needs root (skips otherwise).
//
// The zombie and leftover counts over many runs: --gtest_repeat=20 --gtest_filter='Pid1.*'.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "tests/support/pid_namespace.h"
#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN;

std::vector<std::string> dlaunch_as_pid1(std::vector<std::string> args) {
  args.insert(args.begin(), kDlaunch);
  return with_default_signals(std::move(args));
}

#define SKIP_WITHOUT_PID_NAMESPACES()               \
  do {                                              \
    std::string why = pid_namespaces_unavailable(); \
    if (!why.empty()) GTEST_SKIP() << why;          \
  } while (0)

std::vector<NamespaceProcess> zombies(const PidNamespace& ns) {
  std::vector<NamespaceProcess> out;
  for (auto& p : ns.processes()) {
    if (p.state == 'Z') out.push_back(p);
  }
  return out;
}

size_t live_with_cmdline(const PidNamespace& ns, const std::string& cmdline) {
  size_t n = 0;
  for (auto& p : ns.processes()) n += p.state != 'Z' && p.cmdline == cmdline;
  return n;
}

std::string describe(const std::vector<NamespaceProcess>& ps) {
  std::string s;
  for (auto& p : ps) s += std::to_string(p.pid) + " " + p.state + " '" + p.cmdline + "'\n";
  return s;
}

// Rank 0 double-forks 100 grandchildren that outlive it by a second and exits 0; they come to
// dlaunch (PID 1), which must reap each as it exits while the job still runs. Rank 1 leaves a
// grandchild in a session of its own that ignores SIGTERM, and runs on. SIGTERM to PID 1 then
// ends the job with 143 (--shutdown_grace 5), the setsid grandchild killed by dlaunch.
TEST(Pid1, OrphansAreReapedWhileTheJobRunsAndSigtermEndsItWith143) {
  SKIP_WITHOUT_PID_NAMESPACES();
  TempDir dir;
  const std::string script =
      "if [ \"$LOCAL_RANK\" = 0 ]; then\n"
      "  i=0; while [ $i -lt 100 ]; do (sleep 1.5 &); i=$((i+1)); done\n"
      "  touch " +
      dir.file("forked") +
      "; exit 0\n"
      "fi\n"
      "(setsid sh -c 'trap \"\" TERM; exec sleep 301' &)\n"
      "touch " +
      dir.file("ready") + "; exec sleep 300\n";
  PidNamespace ns(kDlaunch, dlaunch_as_pid1({"--nproc_per_node", "2", "--shutdown_grace", "5",
                                             "--no_python", "/bin/sh", "-c", script}));
  ASSERT_NE(ns.init_pid(), 0) << ns.err();
  ASSERT_TRUE(wait_until(
      [&] { return file_exists(dir.file("forked")) && file_exists(dir.file("ready")); }, 60s))
      << ns.err();
  // Every orphan has exited, and no zombie is left: each was reaped as it exited.
  ASSERT_TRUE(wait_until([&] { return live_with_cmdline(ns, "sleep 1.5") == 0; }, 60s));
  EXPECT_TRUE(wait_until([&] { return zombies(ns).empty(); }, 30s))
      << "zombies in the namespace while dlaunch runs:\n"
      << describe(zombies(ns)) << ns.err();
  ASSERT_EQ(live_with_cmdline(ns, "sleep 300"), 1u) << describe(ns.processes());
  ASSERT_EQ(live_with_cmdline(ns, "sleep 301"), 1u) << describe(ns.processes());

  ASSERT_EQ(::kill(ns.init_pid(), SIGTERM), 0);
  auto exit = ns.wait(60s);  // the grace is 5 s; the setsid grandchild is SIGKILLed
  ASSERT_TRUE(exit) << "SIGTERM to PID 1 did not end the job\n" << ns.err();
  EXPECT_EQ(exit->shell_code(), 128 + SIGTERM) << ns.err();
  EXPECT_NE(ns.err().find("killing orphaned descendant"), std::string::npos) << ns.err();
  EXPECT_EQ(ns.err().find("did not die"), std::string::npos) << ns.err();
  EXPECT_TRUE(ns.processes().empty()) << describe(ns.processes());
}

// While the job stops (the first SIGTERM, a long grace, a worker that ignores it) the loop
// still reaps: orphans that exit then leave no zombie. The worker double-forks 50 of them when
// the SIGTERM reaches it, then runs on; the second SIGTERM ends the job.
TEST(Pid1, OrphansExitingWhileTheJobStopsAreReaped) {
  SKIP_WITHOUT_PID_NAMESPACES();
  TempDir dir;
  const std::string script =
      "trap 'i=0; while [ $i -lt 50 ]; do (sleep 1.6 &); i=$((i+1)); done; touch " +
      dir.file("forked") + "' TERM\n" + "touch " + dir.file("ready") +
      "\nwhile :; do sleep 300 & wait $!; done\n";
  PidNamespace ns(kDlaunch, dlaunch_as_pid1({"--shutdown_grace", "600", "--no_python", "/bin/sh",
                                             "-c", script}));
  ASSERT_NE(ns.init_pid(), 0) << ns.err();
  ASSERT_TRUE(wait_until([&] { return file_exists(dir.file("ready")); }, 60s)) << ns.err();
  ASSERT_EQ(::kill(ns.init_pid(), SIGTERM), 0);
  ASSERT_TRUE(wait_until([&] { return file_exists(dir.file("forked")); }, 60s)) << ns.err();
  ASSERT_TRUE(wait_until([&] { return live_with_cmdline(ns, "sleep 1.6") == 0; }, 60s));
  EXPECT_TRUE(wait_until([&] { return zombies(ns).empty(); }, 30s))
      << "zombies in the namespace while dlaunch stops the job:\n"
      << describe(zombies(ns)) << ns.err();
  EXPECT_EQ(ns.err().find("stopped by SIGTERM"), std::string::npos) << "ended too early\n"
                                                                     << ns.err();
  ASSERT_EQ(::kill(ns.init_pid(), SIGTERM), 0);
  auto exit = ns.wait(60s);
  ASSERT_TRUE(exit) << ns.err();
  EXPECT_EQ(exit->shell_code(), 128 + SIGTERM) << ns.err();
}

// The agent's handlers come after the store is reached, which can take the join timeout (a
// node waiting for its master's pod). A SIGTERM meanwhile was dropped by the kernel (PID 1, no
// handler): the pod sat out its grace period and was SIGKILLed.
TEST(Pid1, SigtermWhileWaitingForTheStoreExits143) {
  SKIP_WITHOUT_PID_NAMESPACES();
  const std::string port = std::to_string(free_port());  // nobody listens there
  PidNamespace ns(kDlaunch, dlaunch_as_pid1({"--nnodes", "2", "--node_rank", "1", "--master_addr",
                                             "127.0.0.1", "--master_port", port, "--rdzv_conf",
                                             "join_timeout=600", "--no_python", "/bin/true"}));
  ASSERT_NE(ns.init_pid(), 0) << ns.err();
  // Past start-up: the orphan guard, dlaunch's first child, is forked just before the store is
  // reached (and nothing is logged while dlaunch waits for it).
  ASSERT_TRUE(wait_until([&] { return ns.processes().size() >= 2; }, 60s)) << ns.err();
  ASSERT_EQ(::kill(ns.init_pid(), SIGTERM), 0);
  auto exit = ns.wait(60s);
  ASSERT_TRUE(exit) << "SIGTERM to PID 1 waiting for the store was lost\n" << ns.err();
  EXPECT_EQ(exit->shell_code(), 128 + SIGTERM) << ns.err();
  EXPECT_NE(ns.err().find("received SIGTERM"), std::string::npos) << ns.err();
}

// docs/cli.md: a second stop signal skips the grace. The grace here is longer than the test
// waits; the worker ignores the first signal.
TEST(Pid1, SecondStopSignalSkipsTheGrace) {
  SKIP_WITHOUT_PID_NAMESPACES();
  for (int sig : {SIGTERM, SIGINT}) {
    TempDir dir;
    PidNamespace ns(
        kDlaunch,
        dlaunch_as_pid1({"--shutdown_grace", "600", "--no_python", "/bin/sh", "-c",
                         "trap '' TERM INT; touch " + dir.file("ready") + "; exec sleep 300"}));
    ASSERT_NE(ns.init_pid(), 0) << ns.err();
    ASSERT_TRUE(wait_until([&] { return file_exists(dir.file("ready")); }, 60s)) << ns.err();
    ASSERT_EQ(::kill(ns.init_pid(), sig), 0);
    ASSERT_TRUE(wait_until(
        [&] {
          return ns.err().find("received " + std::string(sig == SIGTERM ? "SIGTERM" : "SIGINT")) !=
                 std::string::npos;
        },
        30s))
        << ns.err();
    ASSERT_EQ(::kill(ns.init_pid(), sig), 0);
    auto exit = ns.wait(60s);
    ASSERT_TRUE(exit) << ns.err();
    EXPECT_EQ(exit->shell_code(), 128 + sig) << ns.err();
    EXPECT_NE(ns.err().find("killing the workers now"), std::string::npos) << ns.err();
  }
}

}  // namespace
}  // namespace dlaunch::testing
