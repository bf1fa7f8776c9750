// Every way the real dlaunch ends, with the exit code docs/cli.md ("Exit codes") and
// `dlaunch --help` give it: a scheduler's retry policy (a Kubernetes podFailurePolicy) acts on
// these codes. One row per path; the rows that need several nodes run them on 127.0.0.1.
//
// Covered elsewhere, not repeated here: a node lost while its peers' workers fail re-forms
// without spending the budget (DlaunchMultiNode.NodeKilledWhileItsPeersFailDoesNotSpendThe
// RestartBudget); a spare node of a full job exits 0 when the job finishes
// (DlaunchMultiNode.AnAgentWaitingForAPlaceExitsZeroWhenTheJobFinishes); a store port in use
// exits 1 (DlaunchStore.PortInUseIsAClearMessage); dlaunch as a container's PID 1
// (pid1_integration_test).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN;
const std::string kWorker = TEST_WORKER_BIN;

std::vector<std::string> dlaunch(std::vector<std::string> args) {
  args.insert(args.begin(), kDlaunch);
  return with_default_signals(std::move(args));
}

struct Outcome {
  int code = -1;  // the shell's view: 128 + N for a death by signal N; -1: it did not end
  std::string err;
};

Outcome outcome_of(const RunResult& r) {
  return {r.timed_out ? -1 : r.exit.shell_code(), r.err};
}

Outcome outcome_of(Subprocess& p, std::chrono::milliseconds timeout = 60s) {
  auto e = p.wait(timeout);
  return {e ? e->shell_code() : -1, p.err()};
}

// One test worker per node that waits until it is stopped; `sig` to dlaunch once it runs.
Outcome stopped_by(int sig) {
  TempDir dir;
  Subprocess p(dlaunch({"--standalone", kWorker, "sleep", "ready=" + dir.path()}));
  if (!wait_ready(dir, 1, 30s)) return {-1, p.err()};
  p.signal(sig);
  return outcome_of(p);
}

// Node 1 of two, whose store host (node 0) never comes: `sig` while it waits to connect.
Outcome signalled_before_any_worker_started(int sig) {
  const std::string port = std::to_string(free_port());
  Subprocess p(dlaunch({"--nnodes", "2", "--node_rank", "1", "--master_port", port, "--rdzv_conf",
                        "join_timeout=600", kWorker, "ok"}));
  // Past start-up: the orphan guard, dlaunch's first child, is forked just before the store is
  // reached (nothing is logged while dlaunch waits for it).
  if (!wait_until([&] { return !children_of(p.pid()).empty(); }, 30s)) return {-1, p.err()};
  p.signal(sig);
  return outcome_of(p);
}

Outcome preempted() {
  TempDir dir;
  Subprocess p(dlaunch({"--standalone", "--max_restarts", "3", kWorker, "record-signals",
                        "file=" + dir.file("sig"), "ready=" + dir.path()}));
  if (!wait_ready(dir, 1, 30s)) return {-1, p.err()};
  p.signal(SIGUSR1);
  wait_until([&] { return read_file(dir.file("sig.0")).find("SIGUSR1") != std::string::npos; },
             30s);
  p.signal(SIGTERM);  // the scheduler's stop that follows the notice
  return outcome_of(p);
}

// Two static nodes that disagree on --nnodes: both must say so with 78.
Outcome nodes_disagree() {
  const std::string port = std::to_string(free_port());
  auto node = [&](const std::string& nnodes, const std::string& rank) {
    return std::make_unique<Subprocess>(
        dlaunch({"--nnodes", nnodes, "--node_rank", rank, "--master_port", port, "--rdzv_id",
                 "disagree", "--rdzv_conf", "join_timeout=60", kWorker, "ok"}));
  };
  auto n0 = node("2", "0");
  auto n1 = node("3", "1");
  Outcome first = outcome_of(*n0, 90s);
  Outcome second = outcome_of(*n1, 90s);
  if (first.code != second.code) {
    return {-1, "node 0 exited " + std::to_string(first.code) + ", node 1 " +
                    std::to_string(second.code) + "\n" + first.err + second.err};
  }
  return {first.code, first.err + second.err};
}

// Node 0 of two, alone: the other node never joins (or was lost and never came back).
Outcome node_never_joins() {
  return outcome_of(
      run(dlaunch({"--nnodes", "2", "--node_rank", "0", "--master_port",
                   std::to_string(free_port()), "--rdzv_conf", "join_timeout=2", kWorker, "ok"})));
}

// Two c10d agents; the one hosting the store is SIGKILLed while the workers run. (A static
// job notices no lost store while its workers run on: they fail, as collectives do when a node
// dies, and that failure decides.)
Outcome store_lost() {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  TempDir ready;
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(std::make_unique<Subprocess>(
        dlaunch({"--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
                 "--rdzv_id", "storelost", "--rdzv_conf", "last_call_timeout=0.5", kWorker,
                 "sleep", "ready=" + ready.path()})));
  }
  if (!wait_ready(ready, 2, 60s)) return {-1, nodes[0]->err() + nodes[1]->err()};
  const size_t host = nodes[0]->err().find("hosting the job's store") != std::string::npos ? 0 : 1;
  nodes[host]->signal(SIGKILL);
  return outcome_of(*nodes[1 - host], 90s);
}

struct Row {
  std::string path;  // what ends dlaunch
  int code;          // what docs/cli.md says it exits with
  std::function<Outcome()> run;
};

// A file that exists but is not executable.
Outcome program_not_executable() {
  TempDir dir;
  const std::string path = dir.file("not_executable");
  FILE* f = fopen(path.c_str(), "w");
  if (!f) return {-1, "cannot write " + path};
  fputs("echo hi\n", f);
  fclose(f);
  return outcome_of(run(dlaunch({"--standalone", path})));
}

std::vector<Row> rows() {
  return {
      {"every worker exits 0", 0,
       [] {
         return outcome_of(run(dlaunch({"--standalone", "--nproc_per_node", "2", kWorker, "ok"})));
       }},
      {"workers fail past --max_restarts", 1,
       [] {
         return outcome_of(
             run(dlaunch({"--standalone", "--max_restarts", "1", kWorker, "crash", "code=4"})));
       }},
      {"a node never joins (join timeout)", 1, node_never_joins},
      {"the store host is lost", 1, store_lost},
      {"an unknown flag", 2,
       [] {
         return outcome_of(run(dlaunch({"--bogus", "x"})));
       }},
      {"a bad value", 2,
       [] {
         return outcome_of(run(dlaunch({"--nproc_per_node=abc", "x"})));
       }},
      {"a program that is not found", 2,
       [] {
         return outcome_of(run(dlaunch({"--standalone", "no_such_program_dlaunch"})));
       }},
      {"a program that cannot be executed", 2, program_not_executable},
      {"a preemption notice, then the stop", 75, preempted},
      {"nodes with different --nnodes", 78, nodes_disagree},
      {"SIGTERM", 128 + SIGTERM, [] { return stopped_by(SIGTERM); }},
      {"SIGINT", 128 + SIGINT, [] { return stopped_by(SIGINT); }},
      {"SIGHUP", 128 + SIGHUP, [] { return stopped_by(SIGHUP); }},
      {"SIGTERM before any worker started", 128 + SIGTERM,
       [] { return signalled_before_any_worker_started(SIGTERM); }},
      {"a preemption notice before any worker started", 75,
       [] { return signalled_before_any_worker_started(SIGUSR1); }},
  };
}

TEST(DlaunchExitCodes, EveryPathEndsWithItsDocumentedCode) {
  for (const Row& row : rows()) {
    SCOPED_TRACE(row.path);
    Outcome o = row.run();
    EXPECT_EQ(o.code, row.code) << row.path << "\n" << o.err;
  }
}

// The codes above, each in docs/cli.md's table and in --help.
TEST(DlaunchExitCodes, EveryCodeIsDocumented) {
  const std::string doc = read_file(std::string(SOURCE_DIR) + "/docs/cli.md");
  const std::string table = doc.substr(doc.find("## Exit codes"));
  auto help = run({kDlaunch, "--help"});
  ASSERT_EQ(help.exit.shell_code(), 0);
  for (const char* code : {"0", "1", "2", "75", "78", "128 + N"}) {
    EXPECT_NE(table.find(std::string("\n| ") + code + " |"), std::string::npos) << code;
  }
  for (const char* code : {"0", "1", "2", "75", "78", "128+N"}) {
    EXPECT_NE(help.out.find(std::string("\n  ") + code + " "), std::string::npos) << code << "\n"
                                                                                  << help.out;
  }
}

}  // namespace
}  // namespace dlaunch::testing
