#include "launcher/agent/failure_report.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "launcher/process/exit_status.h"
#include "launcher/hang/stack_capture.h"

namespace dlaunch {
namespace {

std::string write_temp(const std::string& text) {
  char name[] = "/tmp/dlaunch_error_XXXXXX";
  int fd = mkstemp(name);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(name) << text;
  return name;
}

TEST(ErrorFile, PyTorchFormat) {
  std::string path = write_temp(
      R"({"message": {"message": "ValueError: x", "extraInfo": {"py_callstack": "Traceback...\nValueError: x", "timestamp": "1700000000"}}})");
  auto e = read_error_file(path);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "ValueError: x");
  EXPECT_EQ(e->traceback, "Traceback...\nValueError: x");
  EXPECT_EQ(e->timestamp, "1700000000");
  std::remove(path.c_str());
}

TEST(ErrorFile, OldFormatAndGarbage) {
  std::string path = write_temp(R"({"message": "boom", "timestamp": 12})");
  auto e = read_error_file(path);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "boom");
  EXPECT_EQ(e->timestamp, "12");
  std::remove(path.c_str());
  path = write_temp("not json");
  e = read_error_file(path);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->raw, "not json");
  std::remove(path.c_str());
  EXPECT_FALSE(read_error_file("/nonexistent/error.json"));
}

TEST(SignalNames, Names) {
  EXPECT_EQ(signal_name(11), "SIGSEGV");
  EXPECT_EQ(signal_name(9), "SIGKILL");
  EXPECT_EQ(parse_signal("term"), 15);
  EXPECT_EQ(parse_signal("SIGUSR1"), 10);
  EXPECT_EQ(parse_signal("9"), 9);
  EXPECT_EQ(parse_signal("nope"), 0);
  EXPECT_EQ(ExitStatus::killed(6).describe(), "signal SIGABRT (6)");
  EXPECT_EQ(ExitStatus::exited(3).describe(), "exit code 3");
}

TEST(FailureReport, RootCauseFirstOthersAsConsequences) {
  std::vector<WorkerRecord> ws(2);
  ws[0].local_rank = 0;
  ws[1].local_rank = 1;
  ws[0].global_rank = 4;
  ws[1].global_rank = 5;
  WorkerGroup g(1, ws);
  auto wall = std::chrono::system_clock::now();
  g.on_started(0, 100, TimePoint{}, wall);
  g.on_started(1, 101, TimePoint{}, wall);
  g.add_stderr_line(1, "RuntimeError: CUDA out of memory");
  g.on_exit(1, ExitStatus::killed(11), TimePoint{}, wall);
  g.on_exit(0, ExitStatus::killed(15), TimePoint{}, wall);
  ReportContext ctx;
  ctx.host = "nodeA";
  ctx.max_restarts = 1;
  ctx.restarts_used = 1;
  ctx.earlier = {"attempt 0: rank 5 (local_rank 1, pid 90): exit code 3"};
  ctx.version = "dlaunch 9.8.7 (commit abcdef0, Release build)";
  std::string r = format_failure_report(g, ctx);
  // What ran, so a report pasted into a bug needs no follow-up question.
  EXPECT_NE(r.find("version: dlaunch 9.8.7 (commit abcdef0, Release build)\n"), std::string::npos)
      << r;
  size_t root = r.find("Root cause");
  size_t others = r.find("Other workers");
  ASSERT_NE(root, std::string::npos);
  ASSERT_NE(others, std::string::npos);
  EXPECT_LT(root, others);
  EXPECT_NE(r.find("rank      : 5 (local_rank: 1)"), std::string::npos) << r;
  EXPECT_NE(r.find("exitcode  : -11 (SIGSEGV) (pid: 101)"), std::string::npos) << r;
  EXPECT_NE(r.find("host      : nodeA"), std::string::npos) << r;
  EXPECT_NE(r.find("CUDA out of memory"), std::string::npos) << r;
  EXPECT_NE(r.find("rank 4 (local_rank 0, pid 100): signal SIGTERM"), std::string::npos) << r;
  EXPECT_NE(r.find("attempt 0: rank 5"), std::string::npos) << r;
}

// Several nodes of one host (--local_addr 127.0.0.2, 127.0.0.3...) share its name: the report
// says which node it is.
TEST(FailureReport, RootCauseNamesTheNodeRankAndAddressOfItsHost) {
  std::vector<WorkerRecord> ws(1);
  WorkerGroup g(0, ws);
  auto wall = std::chrono::system_clock::now();
  g.on_started(0, 100, TimePoint{}, wall);
  g.on_exit(0, ExitStatus::exited(3), TimePoint{}, wall);
  ReportContext ctx;
  ctx.host = "vm";
  ctx.node_rank = 1;
  ctx.local_addr = "127.0.0.3";
  std::string r = format_failure_report(g, ctx);
  EXPECT_NE(r.find("host      : vm (node rank 1, 127.0.0.3)\n"), std::string::npos) << r;
  ctx.node_rank = -1;  // a single node
  ctx.local_addr = "vm";
  r = format_failure_report(g, ctx);
  EXPECT_NE(r.find("host      : vm\n"), std::string::npos) << r;
}

WorkerGroup one_worker_ending(const ExitStatus& end) {
  std::vector<WorkerRecord> ws(1);
  WorkerGroup g(0, ws);
  auto wall = std::chrono::system_clock::now();
  g.on_started(0, 100, TimePoint{}, wall);
  g.on_exit(0, end, TimePoint{}, wall);
  return g;
}

// A bare SIGKILL (dlaunch never sends one to a healthy group) is most often the OOM killer; the
// report said only "-9 (SIGKILL)".
TEST(FailureReport, BareSigkillHintsAtTheOomKiller) {
  ReportContext ctx;
  std::string r = format_failure_report(one_worker_ending(ExitStatus::killed(SIGKILL)), ctx);
  EXPECT_NE(r.find("exitcode  : -9 (SIGKILL) (pid: 100)"), std::string::npos) << r;
  EXPECT_NE(r.find("hint      : SIGKILL, which dlaunch did not send, usually means the kernel's "
                   "OOM\n              killer"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("dmesg"), std::string::npos) << r;
  // Through a shell: exit code 137.
  r = format_failure_report(one_worker_ending(ExitStatus::exited(137)), ctx);
  EXPECT_NE(r.find("hint      : exit code 137 is 128 + SIGKILL"), std::string::npos) << r;
  EXPECT_NE(r.find("OOM killer"), std::string::npos) << r;
  // Other ends get no such hint.
  for (auto end : {ExitStatus::killed(SIGSEGV), ExitStatus::exited(9), ExitStatus::exited(1)}) {
    r = format_failure_report(one_worker_ending(end), ctx);
    EXPECT_EQ(r.find("OOM"), std::string::npos) << r;
  }
}

// Issue 13: after a hang the root cause is the rank the stacks showed stuck outside a collective;
// the report says where it was and shows its Python stack; the victim says what it waited in.
TEST(FailureReport, HangShowsWhereTheRootCauseWasAndItsPythonStack) {
  std::vector<WorkerRecord> ws(2);
  for (int64_t lr : {0, 1}) {
    ws[static_cast<size_t>(lr)].local_rank = lr;
    ws[static_cast<size_t>(lr)].global_rank = lr;
    ws[static_cast<size_t>(lr)].log_dir = "/run/attempt_0/" + std::to_string(lr);
  }
  WorkerGroup g(0, ws);
  auto wall = std::chrono::system_clock::now();
  g.on_started(0, 100, TimePoint{}, wall);
  g.on_started(1, 101, TimePoint{}, wall);
  g.on_hung(0, TimePoint{}, wall);
  g.blame_hang(1);
  g.worker(0).hang_where = "main (train.py:40), natively in c10d::Reducer::finalize_backward()";
  g.worker(1).hang_where = "load_batch (train.py:22)";
  g.worker(1).python_stack = "  File \"train.py\", line 22 in load_batch\n"
                             "  File \"train.py\", line 40 in main\n";
  g.on_exit(0, ExitStatus::killed(15), TimePoint{}, wall);
  g.on_exit(1, ExitStatus::killed(15), TimePoint{}, wall);
  ReportContext ctx;
  ctx.hang_timeout = std::chrono::seconds(3);
  std::string r = format_failure_report(g, ctx);
  EXPECT_NE(r.find("rank      : 1 (local_rank: 1)\n"
                   "  hung      : no heartbeat for more than 3.0 s (pid: 101)\n"
                   "  stacks    : /run/attempt_0/1/stack.txt\n"
                   "  stuck in  : load_batch (train.py:22)\n"
                   "  py_stacks : /run/attempt_0/1/py_stack.txt\n"
                   "  python    : (main thread, most recent call first)\n"
                   "    File \"train.py\", line 22 in load_batch\n"
                   "    File \"train.py\", line 40 in main\n"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("rank 0 (local_rank 0, pid 100): hung: no heartbeat for more than 3.0 s "
                   "(--hang_timeout), in main (train.py:40), natively in "
                   "c10d::Reducer::finalize_backward(), then ended by signal SIGTERM"),
            std::string::npos)
      << r;
}

// Issue 13: the stuck rank is on another node (hang_exchange.h): it is the root cause, with its
// node, stack location and Python stack, and every local worker is listed as its victim.
TEST(FailureReport, HangStuckOnAnotherNodeNamesThatRankAndTheLocalVictims) {
  std::vector<WorkerRecord> ws(1);
  ws[0].global_rank = 0;
  ws[0].log_dir = "/run/attempt_0/0";
  WorkerGroup g(0, ws);
  auto wall = std::chrono::system_clock::now();
  g.on_started(0, 100, TimePoint{}, wall);
  g.on_hung(0, TimePoint{}, wall);
  g.worker(0).hang_where = "all_reduce (distributed_c10d.py:1536)";
  g.on_exit(0, ExitStatus::killed(15), TimePoint{}, wall);
  ReportContext ctx;
  ctx.hang_timeout = std::chrono::seconds(3);
  NodeHangVerdict stuck;
  stuck.node_rank = 1;
  stuck.host = "node-b";
  stuck.stuck_here = true;
  stuck.rank = 1;
  stuck.local_rank = 0;
  stuck.pid = 4242;
  stuck.where = "load_batch (train.py:22)";
  stuck.python_stack = "  File \"train.py\", line 22 in load_batch\n";
  stuck.stacks_dir = "/run/attempt_0/0";
  ctx.stuck_elsewhere = stuck;
  std::string r = format_failure_report(g, ctx);
  EXPECT_NE(r.find("Root cause (a rank stuck on another node; the ranks here waited for it):\n"
                   "  host      : node-b (node rank 1)\n"
                   "  rank      : 1 (local_rank: 0)\n"
                   "  hung      : no heartbeat for more than 3.0 s (pid: 4242)\n"
                   "  stacks    : /run/attempt_0/0/stack.txt (on node-b)\n"
                   "  stuck in  : load_batch (train.py:22)\n"
                   "  python    : (main thread, most recent call first)\n"
                   "    File \"train.py\", line 22 in load_batch\n"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("Workers on this node (its victims: they waited in a collective):\n"
                   "  rank 0 (local_rank 0, pid 100): hung: no heartbeat for more than 3.0 s "
                   "(--hang_timeout), in all_reduce (distributed_c10d.py:1536)"),
            std::string::npos)
      << r;
  EXPECT_EQ(r.find("Root cause (first observed failure)"), std::string::npos) << r;
}

TEST(StackCapture, PrefersEuStackThenGdbThenNothing) {
  char dir[] = "/tmp/dlaunch_tools_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string d = dir;
  auto make_tool = [&](const std::string& name) {
    std::string p = d + "/" + name;
    std::ofstream(p) << "#!/bin/sh\n";
    chmod(p.c_str(), 0755);
  };
  EXPECT_TRUE(stack_capture_command(42, d).empty());
  make_tool("gdb");
  auto gdb = stack_capture_command(42, d);
  ASSERT_FALSE(gdb.empty());
  EXPECT_EQ(gdb[0], d + "/gdb");
  EXPECT_EQ(gdb.back(), "thread apply all bt");
  make_tool("eu-stack");
  EXPECT_EQ(stack_capture_command(42, "/nonexistent:" + d),
            (std::vector<std::string>{d + "/eu-stack", "-p", "42"}));
  std::remove((d + "/gdb").c_str());
  std::remove((d + "/eu-stack").c_str());
  rmdir(dir);
  EXPECT_EQ(first_lines("a\nb\nc\n", 2), "    a\n    b\n");
}

}  // namespace
}  // namespace dlaunch
