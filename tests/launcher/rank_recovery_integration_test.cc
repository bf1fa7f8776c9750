// Rank-level recovery with real processes: the real dlaunch running the test worker's
// rank-recovery mode (tests/support/test_worker.cc), which plays dtrain's side of the contract
// (launcher/agent/rank_replacement.h): it announces rank_recovery, and its survivors read the
// generation counter through the job's store as workers do. Generous timeouts; behaviour only.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN;
const std::string kWorker = TEST_WORKER_BIN;

std::vector<std::string> cmd(std::vector<std::string> flags, std::vector<std::string> worker) {
  std::vector<std::string> argv = {kDlaunch};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(kWorker);
  argv.push_back("rank-recovery");
  argv.insert(argv.end(), worker.begin(), worker.end());
  return with_default_signals(std::move(argv));
}

// Each rank's starts (DIR/started.<rank>.<pid>), one line each, in no particular order.
std::map<int, std::vector<std::string>> starts(const TempDir& dir) {
  std::map<int, std::vector<std::string>> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    const std::string name = entry.path().filename();
    if (name.rfind("started.", 0) != 0) continue;
    const int rank = std::stoi(name.substr(8, name.find('.', 8) - 8));
    out[rank].push_back(read_file(entry.path()));
  }
  return out;
}

// Of ranks 0-2, rank 1 was started twice (once replaced) and the others once, reading the
// verdict `replace`.
void expect_rank_one_replaced_alone(const TempDir& dir, const std::string& err) {
  auto s = starts(dir);
  EXPECT_EQ(s[0].size(), 1u) << err;
  EXPECT_EQ(s[2].size(), 1u) << err;
  EXPECT_EQ(s[1].size(), 2u) << err;
  for (int rank : {0, 2}) {
    EXPECT_EQ(read_file(dir.file("seen." + std::to_string(rank))), "count=1 verdict=replace\n");
  }
}

std::string find_events(const std::string& logs) {
  for (const auto& entry : std::filesystem::recursive_directory_iterator(logs)) {
    if (entry.path().filename() == "events.jsonl") return read_file(entry.path());
  }
  return "";
}

TEST(RankRecovery, OnlyTheFailedRankIsStartedAgainAndTheOthersGoOn) {
  TempDir dir, logs;
  auto r = run(cmd({"--standalone", "--nproc_per_node", "3", "--max_restarts", "3",
                    "--log_dir", logs.path(), "--rdzv_id", "recover"},
                   {"dir=" + dir.path(), "fail=1"}),
               {}, 120s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  auto s = starts(dir);
  // The survivors ran once (same pids all along) and saw generation 1 announced as `replace`.
  for (int rank : {0, 2}) {
    ASSERT_EQ(s[rank].size(), 1u) << rank << "\n" << r.err;
    EXPECT_NE(s[rank][0].find("replacement=0 key=dlaunch/recovery/recover/attempt_0 "
                              "restart_count=0 attempt=0"),
              std::string::npos)
        << s[rank][0];
    EXPECT_EQ(read_file(dir.file("seen." + std::to_string(rank))), "count=1 verdict=replace\n");
  }
  // Rank 1 twice: the replacement with the same rank, restart count and attempt.
  ASSERT_EQ(s[1].size(), 2u) << r.err;
  const std::string second =
      s[1][0].find("replacement=1") != std::string::npos ? s[1][0] : s[1][1];
  EXPECT_NE(second.find("replacement=1 key=dlaunch/recovery/recover/attempt_0 restart_count=0 "
                        "attempt=0"),
            std::string::npos)
      << second;
  EXPECT_EQ(read_file(dir.file("replaced")), "count=1\n");
  // The failure is logged, in the timeline, and counted.
  EXPECT_NE(r.err.find("rank 1 (local 1, pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("failed: exit code 1; replaced in process, the other workers go on; "
                       "restart 1 of 3"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("restarting the worker group"), std::string::npos) << r.err;
  const std::string events = find_events(logs.path());
  EXPECT_NE(events.find("\"event\":\"rank_replaced\""), std::string::npos) << events;
  EXPECT_NE(events.find("\"replacement\":true"), std::string::npos) << events;
  EXPECT_NE(events.find("\"restarts\":1"), std::string::npos) << events;  // job_finished
  // The failed worker's output is kept above its replacement's.
  EXPECT_TRUE(file_exists(logs.path() + "/recover/attempt_0/1/stderr.log")) << r.err;
}

// The same through the node's store proxy: the workers reach the store through it, the agent
// directly, and both see the same keys.
TEST(RankRecovery, TheWorkersReadTheCounterThroughTheStoreProxy) {
  TempDir dir;
  auto r = run(cmd({"--standalone", "--nproc_per_node", "2", "--max_restarts", "1",
                    "--store_proxy", "on"},
                   {"dir=" + dir.path(), "fail=1"}),
               {}, 120s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_EQ(read_file(dir.file("seen.0")), "count=1 verdict=replace\n") << r.err;
  EXPECT_EQ(read_file(dir.file("replaced")), "count=1\n") << r.err;
  EXPECT_EQ(starts(dir)[0].size(), 1u) << r.err;
}

// A second failure while the replacement has not beaten yet: the group may be unable to
// re-form, so it restarts whole (the replacement spent one restart, the group's another).
TEST(RankRecovery, ASecondFailureWhileAReplacementStartsRestartsTheGroup) {
  TempDir dir;
  auto r = run(cmd({"--standalone", "--nproc_per_node", "3", "--max_restarts", "3",
                    "--shutdown_grace", "2"},
                   {"dir=" + dir.path(), "fail=1", "replacement_delay=30", "then_fail=2"}),
               {}, 120s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.err.find("restart 1 of 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 2 (local 2, pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not replaced alone although it announced rank_recovery: an earlier "
                       "replacement on this node has not beaten yet"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("restarting the worker group (2 of 3 restarts)"), std::string::npos)
      << r.err;
  auto s = starts(dir);
  EXPECT_EQ(s[0].size(), 2u) << r.err;  // attempt 0, then the group's attempt 1
}

// A replacement that fails once the budget is spent ends the job; the report lists the
// replaced failure among the earlier ones.
TEST(RankRecovery, TheReportListsTheReplacedFailure) {
  TempDir dir;
  auto r = run(cmd({"--standalone", "--nproc_per_node", "2", "--max_restarts", "1"},
                   {"dir=" + dir.path(), "fail=1", "replacement_exit=3"}),
               {}, 120s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(r.err.find("exit code 1 (replaced in process)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the restart budget is spent (1 of --max_restarts 1"), std::string::npos)
      << r.err;
}

// A worker that did not announce rank_recovery: the whole group restarts, as before.
TEST(RankRecovery, AWorkerThatDidNotAnnounceRestartsTheGroup) {
  TempDir dir;
  auto r = run(cmd({"--standalone", "--nproc_per_node", "3", "--max_restarts", "1",
                    "--shutdown_grace", "2"},
                   {"dir=" + dir.path(), "fail=1", "announce=0"}),
               {}, 120s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.err.find("restarting the worker group (1 of 1 restarts)"), std::string::npos)
      << r.err;
  auto s = starts(dir);
  for (int rank : {0, 1, 2}) EXPECT_EQ(s[rank].size(), 2u) << rank << "\n" << r.err;
  EXPECT_FALSE(file_exists(dir.file("replaced")));
  EXPECT_FALSE(file_exists(dir.file("seen.0")));
}

// No restart left: the job fails as before, and the survivors, waiting for a replacement, read
// the verdict `restart` instead.
TEST(RankRecovery, WithoutBudgetTheSurvivorsReadRestartAndTheJobFails) {
  TempDir dir;
  auto r = run(cmd({"--standalone", "--nproc_per_node", "3", "--max_restarts", "0",
                    "--shutdown_grace", "30"},
                   {"dir=" + dir.path(), "fail=1"}),
               {}, 120s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  EXPECT_NE(r.err.find("not replaced alone although it announced rank_recovery: the restart "
                       "budget is spent (0 of --max_restarts 0"),
            std::string::npos)
      << r.err;
  for (int rank : {0, 2}) {
    EXPECT_EQ(read_file(dir.file("seen." + std::to_string(rank))), "count=1 verdict=restart\n")
        << r.err;
  }
  EXPECT_EQ(starts(dir)[1].size(), 1u);
}

// A hung worker that announced: its stacks are read, it is killed and replaced alone.
TEST(RankRecovery, AHungWorkerIsReplacedAlone) {
  TempDir dir, logs;
  auto r = run(cmd({"--standalone", "--nproc_per_node", "3", "--max_restarts", "2",
                    "--hang_timeout", "2", "--log_dir", logs.path(), "--rdzv_id", "hung"},
                   {"dir=" + dir.path(), "fail=1", "how=stop"}),
               {}, 180s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.err.find("is hung"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hung (no heartbeat for 2.0 s)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("replaced in process, the other workers go on; restart 1 of 2"),
            std::string::npos)
      << r.err;
  expect_rank_one_replaced_alone(dir, r.err);
  const std::string events = find_events(logs.path());
  EXPECT_NE(events.find("\"hung\":true"), std::string::npos) << events;
  if (file_exists("/usr/bin/eu-stack") || file_exists("/usr/bin/gdb")) {
    EXPECT_FALSE(read_file(logs.path() + "/hung/attempt_0/1/stack.txt").empty()) << r.err;
  }
}

// The same with --hang_timeout auto: the ranks beat every 50 ms first, the stuck one is hung
// after the learned timeout (not the 300 s start-up one) and only it is replaced; the others,
// beating while they wait for the verdict, are not declared hung.
TEST(RankRecovery, AHungWorkerIsReplacedAloneWithTheLearnedTimeout) {
  TempDir dir, logs;
  auto r = run(cmd({"--standalone", "--nproc_per_node", "3", "--max_restarts", "2",
                    "--hang_timeout", "auto", "--log_dir", logs.path(), "--rdzv_id", "hung"},
                   {"dir=" + dir.path(), "fail=1", "how=stop", "beat_first=3"}),
               {}, 180s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.err.find("local rank 1 (rank 1, pid"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("local rank 0 (rank 0"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("local rank 2 (rank 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(--hang_timeout auto: "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("start-up timeout"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("replaced in process, the other workers go on; restart 1 of 2"),
            std::string::npos)
      << r.err;
  expect_rank_one_replaced_alone(dir, r.err);
}

// --restart_scope group: no recovery key, no announcement, the whole group restarts.
TEST(RankRecovery, GroupScopeRestartsTheGroupAsBefore) {
  TempDir dir;
  auto r = run(cmd({"--standalone", "--nproc_per_node", "2", "--max_restarts", "1",
                    "--restart_scope", "group", "--shutdown_grace", "2"},
                   {"dir=" + dir.path(), "fail=1"}),
               {}, 120s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  EXPECT_NE(r.err.find("restarting the worker group (1 of 1 restarts)"), std::string::npos)
      << r.err;
  auto s = starts(dir);
  ASSERT_EQ(s[0].size(), 2u) << r.err;
  for (const auto& line : s[0]) EXPECT_NE(line.find("key=<unset>"), std::string::npos) << line;
  EXPECT_FALSE(file_exists(dir.file("replaced")));
}

TEST(RankRecovery, AnUnknownScopeIsAUsageError) {
  auto r = run(cmd({"--standalone", "--restart_scope", "node"}, {}));
  EXPECT_EQ(r.exit.shell_code(), 2) << r.err;
  EXPECT_NE(r.err.find("--restart_scope='node' is not a scope; expected rank"),
            std::string::npos)
      << r.err;
}


// ---- a node lost (--nnodes MIN:MAX): the group shrinks in process --------------------------------

// Three c10d agents on one endpoint, `nproc` workers each, running the test worker's
// rank-recovery mode with `worker` args; node i logs under `logs`/node<i>. `conf`: the
// --rdzv_conf (by default a 3 s keep-alive window and a 0.5 s last call).
std::vector<std::unique_ptr<Subprocess>> three_nodes(
    const std::string& run_id, int nproc, std::vector<std::string> worker, const TempDir& logs,
    int max_restarts = 0,
    const std::string& conf =
        "last_call_timeout=0.5,keep_alive_interval=1,keep_alive_max_attempt=3") {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(std::make_unique<Subprocess>(
        cmd({"--nnodes", "2:3", "--nproc_per_node", std::to_string(nproc), "--rdzv_endpoint",
             endpoint, "--rdzv_id", run_id, "--max_restarts", std::to_string(max_restarts),
             "--shutdown_grace", "2",
             "--log_dir", logs.path() + "/node" + std::to_string(i), "--rdzv_conf",
             conf},
            worker)));
  }
  return nodes;
}

// SIGKILLs the first agent that does not host the job's store, and its workers (their pids from
// DIR/started.<rank>.<pid>, their ranks from the agent's "global ranks A-B" line); returns the
// agent's index and those ranks, or none when every agent hosts the store.
struct Killed {
  size_t node = 0;
  std::set<int> ranks;
};
Killed kill_a_node(std::vector<std::unique_ptr<Subprocess>>& nodes, const TempDir& dir) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto& node = nodes[i];
    const std::string err = node->err();
    if (err.find("hosting the job's store") != std::string::npos) continue;
    const size_t at = err.find("global ranks ");
    if (at == std::string::npos) return {};
    const int first = std::stoi(err.substr(at + 13));
    const int last = std::stoi(err.substr(err.find('-', at) + 1));
    node->signal(SIGKILL);
    node->wait(30s);
    Killed killed{i, {}};
    auto started = starts(dir);
    for (int rank = first; rank <= last; ++rank) {
      killed.ranks.insert(rank);
      for (const std::string& start : started[rank]) {
        ::kill(std::stoi(start.substr(4)), SIGKILL);  // "pid=P ..."
      }
    }
    return killed;
  }
  return {};
}

// A node SIGKILLed with its workers: the other two re-rendezvous without stopping theirs, which
// read the verdict `shrink 4 <round>` and their new ranks (contiguous per node) and finish.
// The last call is 300 s: the survivors' round completes once both are back (expect_nodes),
// or they would wait it out past the test's 120 s.
TEST(RankRecovery, ALostNodeShrinksTheGroupInPlace) {
  TempDir dir, logs;
  auto nodes = three_nodes("shrink", 2, {"dir=" + dir.path(), "fail=-1"}, logs, 0,
                           "last_call_timeout=300,keep_alive_interval=1,keep_alive_max_attempt=3");
  ASSERT_TRUE(wait_ready(dir, 6, 90s));
  const Killed killed = kill_a_node(nodes, dir);
  const std::set<int>& lost = killed.ranks;
  ASSERT_EQ(lost.size(), 2u);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == killed.node) continue;
    auto& node = nodes[i];
    auto e = node->wait(120s);
    ASSERT_TRUE(e) << node->err();
    EXPECT_EQ(e->shell_code(), 0) << node->err();
    // Its agent's store connection closed with it: found lost without waiting out the window.
    EXPECT_NE(node->err().find("lost (its agent's store connection closed and no keep-alive came "
                               "for 0.5 s): the group re-forms in process at world size 4"),
              std::string::npos)
        << node->err();
    EXPECT_EQ(node->err().find("restarting the worker"), std::string::npos) << node->err();
    const std::string events = find_events(logs.path() + "/node" + std::to_string(i));
    EXPECT_NE(events.find("\"event\":\"shrink\""), std::string::npos) << events;
    EXPECT_NE(events.find("\"world_size\":4"), std::string::npos) << events;
    EXPECT_NE(events.find("\"restarts\":0"), std::string::npos) << events;  // job_finished
  }
  // The survivors ran once (same pids all along) and each read its new rank.
  auto s = starts(dir);
  std::set<std::string> new_ranks;
  for (int rank = 0; rank < 6; ++rank) {
    if (lost.count(rank)) continue;
    EXPECT_EQ(s[rank].size(), 1u) << rank;
    const std::string seen = read_file(dir.file("seen." + std::to_string(rank)));
    EXPECT_EQ(seen.rfind("count=1 verdict=shrink 4 ", 0), 0u) << seen;
    const size_t at = seen.find(" rank=");
    ASSERT_NE(at, std::string::npos) << seen;
    new_ranks.insert(seen.substr(at + 6, seen.size() - at - 7));
  }
  EXPECT_EQ(new_ranks, (std::set<std::string>{"0", "1", "2", "3"}));
}

// The same with a 30 s keep-alive window (interval 5 s x 6): the store host sees the killed
// agent's connection end at once, and the survivors re-form after the grace (half an
// interval), long before the window would let them.
TEST(RankRecovery, ALostNodeIsFoundByItsClosedConnectionLongBeforeTheWindow) {
  TempDir dir, logs;
  auto nodes = three_nodes("closed", 2, {"dir=" + dir.path(), "fail=-1"}, logs, 0,
                           "last_call_timeout=0.5,keep_alive_interval=5,keep_alive_max_attempt=6");
  ASSERT_TRUE(wait_ready(dir, 6, 90s));
  const Killed killed = kill_a_node(nodes, dir);
  ASSERT_EQ(killed.ranks.size(), 2u);
  const std::string reformed =
      "lost (its agent's store connection closed and no keep-alive came for 2.5 s): the group "
      "re-forms in process at world size 4";
  // Generous for a loaded machine, and still short of the 30 s window (counted from the kill,
  // which was before this point).
  const auto until = std::chrono::steady_clock::now() + 25s;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == killed.node) continue;
    bool seen = false;
    while (!seen && std::chrono::steady_clock::now() < until) {
      seen = nodes[i]->err().find(reformed) != std::string::npos;
      if (!seen) std::this_thread::sleep_for(100ms);
    }
    EXPECT_TRUE(seen) << "not re-formed within 25 s of the kill:\n" << nodes[i]->err();
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == killed.node) continue;
    auto e = nodes[i]->wait(120s);
    ASSERT_TRUE(e) << nodes[i]->err();
    EXPECT_EQ(e->shell_code(), 0) << nodes[i]->err();
    EXPECT_EQ(nodes[i]->err().find("no keep-alive for 30 s"), std::string::npos)
        << nodes[i]->err();
  }
}

// After the shrink a rank fails and is replaced alone in the smaller world: the replacement gets
// its new rank and world size, and meets the others in their store namespace (it reads the
// counter they see: the shrink's generation, then its own).
TEST(RankRecovery, ARankReplacedAfterAShrinkHasItsNewRank) {
  TempDir dir, logs;
  auto nodes =
      three_nodes("shrinkreplace", 2, {"dir=" + dir.path(), "fail=-1", "fail_after_shrink=3"},
                  logs, /*max_restarts=*/1);
  ASSERT_TRUE(wait_ready(dir, 6, 90s));
  const Killed killed = kill_a_node(nodes, dir);
  ASSERT_EQ(killed.ranks.size(), 2u);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == killed.node) continue;
    auto e = nodes[i]->wait(120s);
    ASSERT_TRUE(e) << nodes[i]->err();
    EXPECT_EQ(e->shell_code(), 0) << nodes[i]->err();
  }
  EXPECT_EQ(read_file(dir.file("replaced")), "count=2\n");
  auto s = starts(dir);
  bool found = false;
  for (const std::string& start : s[3]) {
    if (start.find("replacement=1") == std::string::npos) continue;
    found = true;
    EXPECT_NE(start.find("restart_count=0 attempt=0 world=4"), std::string::npos) << start;
  }
  EXPECT_TRUE(found) << "no replacement started as rank 3";
  int waited = 0;
  for (int rank = 0; rank < 6; ++rank) {
    if (!file_exists(dir.file("seen_again." + std::to_string(rank)))) continue;
    ++waited;
    EXPECT_EQ(read_file(dir.file("seen_again." + std::to_string(rank))),
              "count=2 verdict=replace\n");
  }
  EXPECT_EQ(waited, 3);
}

// The same with workers that did not announce rank_recovery: today's whole-group restart in the
// smaller world, and the log says why the group was not re-formed in process.
TEST(RankRecovery, ALostNodeRestartsGroupsThatDidNotAnnounce) {
  TempDir dir, logs;
  auto nodes =
      three_nodes("noshrink", 1, {"dir=" + dir.path(), "fail=-1", "announce=0"}, logs);
  ASSERT_TRUE(wait_ready(dir, 3, 90s));
  const Killed killed = kill_a_node(nodes, dir);
  const std::set<int>& lost = killed.ranks;
  ASSERT_EQ(lost.size(), 1u);
  int survivors = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == killed.node) continue;
    auto& node = nodes[i];
    ++survivors;
    auto e = node->wait(120s);
    ASSERT_TRUE(e) << node->err();
    EXPECT_EQ(e->shell_code(), 0) << node->err();
    EXPECT_NE(node->err().find("not re-formed in process: not every worker here announced "
                               "rank_recovery"),
              std::string::npos)
        << node->err();
    EXPECT_EQ(node->err().find("re-forms in process"), std::string::npos) << node->err();
  }
  EXPECT_EQ(survivors, 2);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_FALSE(file_exists(dir.file("seen." + std::to_string(rank)))) << rank;
  }
}

}  // namespace
}  // namespace dlaunch::testing
