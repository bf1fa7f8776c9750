// The status endpoint, the job timeline and `dlaunch status|stop|restart|dump` against real
// dlaunch agents on 127.0.0.1 (issue 13): what /status and /metrics say about running workers,
// that stop/restart take the documented paths, that control needs the job token, that nothing
// is left behind, and that a real Prometheus server scrapes /metrics.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "launcher/status/http_client.h"
#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN;

// The endpoint address an agent printed ("127.0.0.1:41234"), waiting up to 30 s for the line.
std::string endpoint_of(const Subprocess& agent) {
  const std::string marker = "status endpoint: http://";
  std::string addr;
  wait_until(
      [&]() {
        std::string err = agent.err();
        size_t at = err.find(marker);
        if (at == std::string::npos) return false;
        at += marker.size();
        addr = err.substr(at, err.find("/status", at) - at);
        return true;
      },
      30s);
  return addr;
}

nlohmann::json get_json(const std::string& addr, const std::string& target) {
  HttpReply r = http_request(addr, "GET", target);
  EXPECT_EQ(r.status, 200) << r.body;
  return nlohmann::json::parse(r.body);
}

// Waits until every worker the agent reports runs (its status says so).
bool workers_running(const std::string& addr, size_t n) {
  return wait_until(
      [&]() {
        try {
          auto j = get_json(addr, "/status");
          if (j["workers"].size() != n) return false;
          for (const auto& w : j["workers"]) {
            if (w["state"] != "running") return false;
          }
          return true;
        } catch (const std::exception&) {
          return false;
        }
      },
      30s);
}

std::vector<std::string> job_args(const std::string& port, const std::string& run_id) {
  return {"--master_port", port, "--rdzv_id", run_id};
}

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string events_text(const std::string& log_dir, const std::string& run_id) {
  return read_file(log_dir + "/" + run_id + "/events.jsonl");
}

TEST(StatusEndpoint, ServesStatusAndMetricsOfRunningWorkers) {
  TempDir logs;
  std::string port = std::to_string(free_port());
  Subprocess agent(cat({kDlaunch, "--nproc_per_node", "3", "--log_dir", logs.path()},
                       cat(job_args(port, "st-serve"), {"--no_python", "/bin/sleep", "60"})));
  std::string addr = endpoint_of(agent);
  ASSERT_FALSE(addr.empty()) << agent.err();
  EXPECT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << "one node binds loopback: " << addr;
  ASSERT_TRUE(workers_running(addr, 3)) << agent.err();
  auto j = get_json(addr, "/status");
  EXPECT_EQ(j["run_id"], "st-serve");
  EXPECT_EQ(j["attempt"], 0);
  EXPECT_EQ(j["node_rank"], 0);
  EXPECT_EQ(j["agent_pid"], agent.pid());
  std::set<int64_t> ranks;
  for (const auto& w : j["workers"]) {
    ranks.insert(w["rank"].get<int64_t>());
    EXPECT_TRUE(process_alive(w["pid"].get<int>()));
    EXPECT_GT(w["usage"]["rss_bytes"].get<int64_t>(), 0);
    EXPECT_GT(w["start_time"].get<double>(), 0);
  }
  EXPECT_EQ(ranks, (std::set<int64_t>{0, 1, 2}));
  ASSERT_FALSE(j["store"].is_null()) << "this agent hosts the store";
  // The agent publishes its endpoint in the store it hosts: two keys.
  EXPECT_TRUE(wait_until([&]() { return get_json(addr, "/status")["store"]["keys"] >= 2; }, 30s))
      << get_json(addr, "/status").dump();

  HttpReply m = http_request(addr, "GET", "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_EQ(m.headers["content-type"].rfind("text/plain; version=0.0.4", 0), 0u);
  EXPECT_NE(m.body.find("# TYPE dlaunch_worker_up gauge"), std::string::npos);
  EXPECT_NE(m.body.find("dlaunch_worker_up{run_id=\"st-serve\",node=\""), std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("\",node_rank=\"0\",rank=\"2\",local_rank=\"2\"} 1"), std::string::npos)
      << m.body;
  EXPECT_EQ(http_request(addr, "GET", "/nope").status, 404);
  EXPECT_EQ(http_request(addr, "POST", "/status").status, 405);
  EXPECT_EQ(http_request(addr, "DELETE", "/metrics").status, 405);
  agent.signal(SIGTERM);
  auto e = agent.wait(30s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->shell_code(), 143);
}

TEST(StatusEndpoint, StatusCommandListsWorkersAndStopEndsTheJobAsSigterm) {
  TempDir logs;
  std::string port = std::to_string(free_port());
  Subprocess agent(cat({kDlaunch, "--nproc_per_node", "2", "--log_dir", logs.path()},
                       cat(job_args(port, "st-stop"), {"--no_python", "/bin/sleep", "60"})));
  std::string addr = endpoint_of(agent);
  ASSERT_TRUE(workers_running(addr, 2)) << agent.err();
  RunResult table = run({kDlaunch, "status", "--master_port", port, "--rdzv_id", "st-stop"});
  EXPECT_EQ(table.exit.shell_code(), 0) << table.err;
  EXPECT_NE(table.out.find("job st-stop: 1 agent(s)"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find(addr), std::string::npos) << table.out;
  size_t running = 0;
  for (size_t at = table.out.find(" running "); at != std::string::npos;
       at = table.out.find(" running ", at + 1)) {
    ++running;
  }
  EXPECT_EQ(running, 3u) << "the node line and two worker lines: " << table.out;
  RunResult js = run({kDlaunch, "status", "--master_port", port, "--rdzv_id", "st-stop", "--json"});
  EXPECT_EQ(js.exit.shell_code(), 0) << js.err;
  auto j = nlohmann::json::parse(js.out);
  ASSERT_EQ(j["agents"].size(), 1u);
  EXPECT_EQ(j["agents"][0]["workers"].size(), 2u);

  RunResult stop = run({kDlaunch, "stop", "--master_port", port, "--rdzv_id", "st-stop"});
  EXPECT_EQ(stop.exit.shell_code(), 0) << stop.err;
  auto e = agent.wait(30s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->shell_code(), 143) << agent.err();
  EXPECT_NE(agent.err().find("stop requested by dlaunch stop from 127.0.0.1"), std::string::npos);
  EXPECT_EQ(agent.err().find("received SIGTERM"), std::string::npos)
      << "no signal came: " << agent.err();
  std::string events = events_text(logs.path(), "st-stop");
  for (const char* kind : {"\"agent_started\"", "\"worker_started\"", "\"control_request\"",
                           "\"worker_exited\"", "\"job_finished\""}) {
    EXPECT_NE(events.find(kind), std::string::npos) << kind << " in\n" << events;
  }
  EXPECT_EQ(events.find("\"signal_received\""), std::string::npos) << events;
  EXPECT_NE(events.find("\"exit_code\":143"), std::string::npos) << events;
}

// While node 0 waits at the rendezvous for the others (the moment a user most needs it),
// `dlaunch status` finds the job through node 0's store and shows it waiting.
TEST(StatusEndpoint, StatusCommandWorksWhileTheJobWaitsForNodes) {
  std::string port = std::to_string(free_port());
  Subprocess agent({kDlaunch, "--nnodes", "2", "--node_rank", "0", "--master_addr", "127.0.0.1",
                    "--master_port", port, "--rdzv_id", "st-wait", "--no_python", "/bin/true"});
  ASSERT_FALSE(endpoint_of(agent).empty()) << agent.err();
  RunResult table;
  EXPECT_TRUE(wait_until([&] {
    table = run({kDlaunch, "status", "--master_port", port, "--rdzv_id", "st-wait"});
    return table.exit.shell_code() == 0;
  }, 30s)) << table.err;
  EXPECT_NE(table.out.find("rendezvous"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("waits at the rendezvous: 1 of --nnodes 2 nodes joined"),
            std::string::npos)
      << table.out;
  // The waiting agent says so, with the count, after a few seconds (not after the join timeout).
  EXPECT_TRUE(wait_until([&] { return agent.err().find("(1 of 2 nodes joined)") != std::string::npos; },
                         30s))
      << agent.err();
  agent.signal(SIGTERM);
  ASSERT_TRUE(agent.wait(30s));
}

// The same for an elastic (c10d) job: its status shows how many nodes joined the forming round,
// and the waiting agent says so at growing intervals, naming who joined and how long of the
// join timeout has passed.
TEST(StatusEndpoint, StatusAndLogShowAnElasticRoundThatWaitsForNodes) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  Subprocess agent({kDlaunch, "--nnodes", "2:3", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                    endpoint, "--rdzv_id", "st-wait-c10d", "--local_addr", "127.0.0.1",
                    "--no_python", "/bin/true"});
  ASSERT_FALSE(endpoint_of(agent).empty()) << agent.err();
  RunResult table;
  EXPECT_TRUE(wait_until([&] {
    table = run({kDlaunch, "status", "--rdzv_endpoint", endpoint, "--rdzv_id", "st-wait-c10d"});
    return table.exit.shell_code() == 0 &&
           table.out.find("waits at the rendezvous") != std::string::npos;
  }, 30s)) << table.out << table.err;
  EXPECT_NE(table.out.find("waits at the rendezvous: 1 of --nnodes 2:3 nodes joined round 0"),
            std::string::npos)
      << table.out;
  EXPECT_TRUE(wait_until(
      [&] {
        const std::string err = agent.err();
        const size_t at = err.find(
            "waiting for the other nodes (1 of --nnodes 2:3 joined round 0: 127.0.0.1) for ");
        return at != std::string::npos &&
               err.find(" s of the 600 s join timeout", at) != std::string::npos;
      },
      30s))
      << agent.err();
  agent.signal(SIGTERM);
  ASSERT_TRUE(agent.wait(30s));
}

// Nodes of one host (--local_addr 127.0.0.2 and 127.0.0.3) share its name: the status says
// which node a worker belongs to by its address too.
TEST(StatusEndpoint, NodesOfOneHostAreToldApartByTheirAddress) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (const char* addr : {"127.0.0.2", "127.0.0.3"}) {
    nodes.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        kDlaunch, "--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
        "--rdzv_id", "st-addr", "--local_addr", addr, "--no_python", "/bin/sleep", "60"}));
  }
  for (auto& n : nodes) ASSERT_TRUE(workers_running(endpoint_of(*n), 1)) << n->err();
  RunResult table;
  EXPECT_TRUE(wait_until([&] {
    table = run({kDlaunch, "status", "--rdzv_endpoint", endpoint, "--rdzv_id", "st-addr"});
    return table.exit.shell_code() == 0 && table.out.find("2 agent(s)") != std::string::npos;
  }, 30s)) << table.out << table.err;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  for (const char* addr : {"127.0.0.2", "127.0.0.3"}) {
    EXPECT_NE(table.out.find(std::string(host) + " (" + addr + ")"), std::string::npos)
        << table.out;
  }
  for (auto& n : nodes) {
    n->signal(SIGTERM);
    EXPECT_TRUE(n->wait(30s));
  }
}

// A static job given its store as --rdzv_endpoint: the command the agent prints finds it there.
TEST(StatusEndpoint, ThePrintedStatusCommandNamesTheEndpointTheJobWasGiven) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  Subprocess agent({kDlaunch, "--nnodes", "2", "--node_rank", "0", "--rdzv_endpoint", endpoint,
                    "--rdzv_id", "st-endpoint", "--no_python", "/bin/true"});
  ASSERT_FALSE(endpoint_of(agent).empty()) << agent.err();
  EXPECT_NE(agent.err().find("every node's: dlaunch status --rdzv_endpoint " + endpoint +
                             " --rdzv_id st-endpoint"),
            std::string::npos)
      << agent.err();
  RunResult table;
  EXPECT_TRUE(wait_until([&] {
    table = run({kDlaunch, "status", "--rdzv_endpoint", endpoint, "--rdzv_id", "st-endpoint"});
    return table.exit.shell_code() == 0;
  }, 30s)) << table.err;
  agent.signal(SIGTERM);
  ASSERT_TRUE(agent.wait(30s));
}

TEST(StatusEndpoint, RestartIsCountedAndRefusedOnceTheBudgetIsSpent) {
  TempDir logs;
  std::string port = std::to_string(free_port());
  Subprocess agent(
      cat({kDlaunch, "--nproc_per_node", "1", "--max_restarts", "1", "--log_dir", logs.path()},
          cat(job_args(port, "st-restart"), {"--no_python", "/bin/sleep", "60"})));
  std::string addr = endpoint_of(agent);
  ASSERT_TRUE(workers_running(addr, 1)) << agent.err();
  int first_pid = get_json(addr, "/status")["workers"][0]["pid"];
  RunResult r1 = run({kDlaunch, "restart", "--master_port", port, "--rdzv_id", "st-restart"});
  EXPECT_EQ(r1.exit.shell_code(), 0) << r1.err;
  EXPECT_NE(r1.out.find("1 of 1 restarts"), std::string::npos) << r1.out;
  ASSERT_TRUE(wait_until([&]() { return get_json(addr, "/status")["attempt"] == 1; }, 30s));
  ASSERT_TRUE(workers_running(addr, 1));
  auto j = get_json(addr, "/status");
  EXPECT_EQ(j["restarts"], 1);
  EXPECT_NE(j["workers"][0]["pid"].get<int>(), first_pid);
  RunResult r2 = run({kDlaunch, "restart", "--master_port", port, "--rdzv_id", "st-restart"});
  EXPECT_EQ(r2.exit.shell_code(), 1);
  EXPECT_NE(r2.err.find("restart budget is spent"), std::string::npos) << r2.err;
  EXPECT_EQ(get_json(addr, "/status")["phase"], "running") << "a refused restart changes nothing";
  EXPECT_NE(events_text(logs.path(), "st-restart").find("\"counted\":true"), std::string::npos);
  EXPECT_NE(events_text(logs.path(), "st-restart").find("\"control_refused\""), std::string::npos)
      << "the refused restart is in the timeline";
  agent.signal(SIGTERM);
  ASSERT_TRUE(agent.wait(30s));
}

TEST(StatusEndpoint, ControlNeedsTheJobTokenWhenOneIsSet) {
  TempDir logs;
  std::string port = std::to_string(free_port());
  Subprocess agent(cat({kDlaunch, "--nproc_per_node", "1", "--log_dir", logs.path()},
                       cat(job_args(port, "st-token"), {"--no_python", "/bin/sleep", "60"})),
                   {{"DLAUNCH_JOB_TOKEN", "s3cret"}});
  std::string addr = endpoint_of(agent);
  ASSERT_TRUE(workers_running(addr, 1)) << agent.err();
  // A bare request, with no proof at all.
  HttpReply bare = http_request(addr, "POST", "/control/stop");
  EXPECT_EQ(bare.status, 403) << bare.body;
  // The command with the wrong token cannot even read the store; with the right store access
  // but a wrong proof, the agent refuses.
  RunResult wrong = run({kDlaunch, "stop", "--master_port", port, "--rdzv_id", "st-token"},
                        {{"DLAUNCH_JOB_TOKEN", "wrong"}});
  EXPECT_NE(wrong.exit.shell_code(), 0);
  EXPECT_TRUE(agent.wait(1s) == std::nullopt) << "the job still runs";
  EXPECT_NE(agent.err().find("refused a control request (stop) from 127.0.0.1"), std::string::npos)
      << agent.err();
  // Reading the status needs no token (it is as public as the port).
  EXPECT_EQ(http_request(addr, "GET", "/status").status, 200);
  RunResult stop = run({kDlaunch, "stop", "--master_port", port, "--rdzv_id", "st-token"},
                       {{"DLAUNCH_JOB_TOKEN", "s3cret"}});
  EXPECT_EQ(stop.exit.shell_code(), 0) << stop.err;
  auto e = agent.wait(30s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->shell_code(), 143);
  EXPECT_NE(events_text(logs.path(), "st-token").find("\"control_refused\""), std::string::npos);
}

TEST(StatusEndpoint, StatusPortMinusOneServesNothing) {
  std::string port = std::to_string(free_port());
  Subprocess agent(cat({kDlaunch, "--nproc_per_node", "1", "--status_port", "-1"},
                       cat(job_args(port, "st-off"), {"--no_python", "/bin/sleep", "60"})));
  ASSERT_TRUE(
      wait_until([&]() { return agent.err().find("attempt 0") != std::string::npos; }, 30s));
  EXPECT_EQ(agent.err().find("status endpoint"), std::string::npos) << agent.err();
  RunResult r = run({kDlaunch, "status", "--master_port", port, "--rdzv_id", "st-off"});
  EXPECT_EQ(r.exit.shell_code(), 2);
  EXPECT_NE(r.err.find("no agent of job 'st-off' published a status endpoint"), std::string::npos)
      << r.err;
  agent.signal(SIGTERM);
  ASSERT_TRUE(agent.wait(30s));
}

TEST(StatusEndpoint, JobControlUsage) {
  RunResult help = run({kDlaunch, "status", "--help"});
  EXPECT_EQ(help.exit.shell_code(), 0);
  EXPECT_NE(help.out.find("usage: dlaunch status|stop|restart|dump"), std::string::npos);
  RunResult bad = run({kDlaunch, "stop", "--bogus"});
  EXPECT_EQ(bad.exit.shell_code(), 2);
  EXPECT_NE(bad.err.find("'--bogus' is not an option of 'dlaunch stop'"), std::string::npos)
      << bad.err;
  RunResult json = run({kDlaunch, "stop", "--json"});
  EXPECT_EQ(json.exit.shell_code(), 2);
  RunResult nowhere =
      run({kDlaunch, "status", "--master_port", std::to_string(free_port()), "--timeout", "1"});
  EXPECT_EQ(nowhere.exit.shell_code(), 2);
  EXPECT_NE(nowhere.err.find("cannot read the job's agents from its store"), std::string::npos)
      << nowhere.err;
  // Nothing listens: said at once, not retried for the whole --timeout.
  RunResult none = run({kDlaunch, "stop", "--master_port", std::to_string(free_port())});
  EXPECT_EQ(none.exit.shell_code(), 2);
  EXPECT_NE(none.err.find("nothing listens there (connection refused)"), std::string::npos)
      << none.err;
  for (const char* bad : {"nan", "0", "-1", "inf"}) {
    RunResult t = run({kDlaunch, "status", "--timeout", bad});
    EXPECT_EQ(t.exit.shell_code(), 2) << bad;
    EXPECT_NE(t.err.find("--timeout " + std::string(bad) + " is not allowed"), std::string::npos)
        << t.err;
  }
}

size_t entries(const std::string& dir) {
  size_t n = 0;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

TEST(StatusEndpoint, LeavesNoThreadFdOrProcessBehind) {
  TempDir logs;
  std::string port = std::to_string(free_port());
  Subprocess agent(cat({kDlaunch, "--nproc_per_node", "4", "--log_dir", logs.path()},
                       cat(job_args(port, "st-clean"), {"--no_python", "/bin/sleep", "60"})));
  std::string addr = endpoint_of(agent);
  ASSERT_TRUE(workers_running(addr, 4)) << agent.err();
  const std::string proc = "/proc/" + std::to_string(agent.pid());
  // The baseline once the agent is idle: the endpoint's publisher thread and its store
  // connection are gone, the status requests above are closed.
  size_t threads_before = 0, fds_before = 0;
  ASSERT_TRUE(wait_until(
      [&]() {
        size_t t = entries(proc + "/task"), f = entries(proc + "/fd");
        std::this_thread::sleep_for(300ms);
        threads_before = entries(proc + "/task");
        fds_before = entries(proc + "/fd");
        return t == threads_before && f == fds_before && threads_before == 2;
      },
      30s))
      << "the agent of one node runs two threads (its loop and the store server's), has "
      << threads_before;
  // Every process of the job: the workers and the orphan guard.
  std::vector<int> job = children_of(agent.pid());
  for (int i = 0; i < 100; ++i) {
    http_request(addr, "GET", i % 2 ? "/status" : "/metrics");
  }
  // Clients that connect and go away without a request, or send half of one.
  for (int i = 0; i < 5; ++i) {
    try {
      http_request(addr, "GET", "/status", {}, "", std::chrono::milliseconds(1));
    } catch (const std::exception&) {
    }
  }
  EXPECT_TRUE(wait_until([&]() { return entries(proc + "/fd") <= fds_before; }, 15s))
      << "fds before " << fds_before << ", now " << entries(proc + "/fd");
  EXPECT_EQ(entries(proc + "/task"), threads_before) << "the endpoint runs on the agent's loop";
  RunResult stop = run({kDlaunch, "stop", "--master_port", port, "--rdzv_id", "st-clean"});
  EXPECT_EQ(stop.exit.shell_code(), 0) << stop.err;
  ASSERT_TRUE(agent.wait(30s));
  EXPECT_GE(job.size(), 4u);
  for (int pid : job) {
    EXPECT_TRUE(wait_until([&]() { return !process_alive(pid); }, 10s))
        << "pid " << pid << " lives";
  }
  EXPECT_THROW(http_request(addr, "GET", "/status"), std::exception) << "the port is closed";
}

TEST(StatusEndpoint, DumpWritesEveryWorkersStacks) {
  bool have_tool = file_exists("/usr/bin/eu-stack") || file_exists("/usr/bin/gdb");
  if (!have_tool) GTEST_SKIP() << "neither eu-stack nor gdb is installed (scripts/setup.sh --test)";
  TempDir logs;
  std::string port = std::to_string(free_port());
  Subprocess agent(cat({kDlaunch, "--nproc_per_node", "2", "--log_dir", logs.path()},
                       cat(job_args(port, "st-dump"), {"--no_python", "/bin/sleep", "60"})));
  std::string addr = endpoint_of(agent);
  ASSERT_TRUE(workers_running(addr, 2)) << agent.err();
  RunResult r = run({kDlaunch, "dump", "--master_port", port, "--rdzv_id", "st-dump"});
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  std::string dir_marker = "stacks of 2 worker(s) in ";
  size_t at = r.out.find(dir_marker);
  ASSERT_NE(at, std::string::npos) << r.out;
  std::string dir = r.out.substr(at + dir_marker.size());
  dir = dir.substr(0, dir.find('\n'));
  EXPECT_EQ(dir.rfind(logs.path() + "/st-dump/dumps/", 0), 0u) << dir;
  for (int rank : {0, 1}) {
    std::string text = read_file(dir + "/rank_" + std::to_string(rank) + ".txt");
    EXPECT_NE(text.find("nanosleep"), std::string::npos) << "rank " << rank << ":\n" << text;
  }
  EXPECT_EQ(get_json(addr, "/status")["phase"], "running") << "a dump does not stop anything";
  agent.signal(SIGTERM);
  ASSERT_TRUE(agent.wait(30s));
}

// A Python worker runs with dlaunch's hooks by default: `dump` adds its Python stack (the
// function it sits in) after the native one.
TEST(StatusEndpoint, DumpAddsThePythonStacksOfPythonWorkers) {
  bool have_tool = file_exists("/usr/bin/eu-stack") || file_exists("/usr/bin/gdb");
  if (!have_tool) GTEST_SKIP() << "neither eu-stack nor gdb is installed (scripts/setup.sh --test)";
  if (!file_exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  TempDir logs;
  std::string script = logs.path() + "/waiter.py";
  const std::string in_user_code = logs.path() + "/in_user_code";
  {
    std::ofstream f(script);
    f << "import time\n"
         "def waiting_in_user_code():\n"
         "    open('" << in_user_code << "', 'w').close()\n"
         "    while True:\n"
         "        time.sleep(0.05)\n"
         "waiting_in_user_code()\n";
  }
  std::string port = std::to_string(free_port());
  Subprocess agent(cat({kDlaunch, "--nproc_per_node", "1", "--log_dir", logs.path(), "--python",
                        "/usr/bin/python3"},
                       cat(job_args(port, "st-pydump"), {script})));
  std::string addr = endpoint_of(agent);
  ASSERT_TRUE(workers_running(addr, 1)) << agent.err();
  // The hooks register in py_stack.txt as the interpreter starts; a dump before that has no
  // Python part, by design (the signal would kill an unhooked process).
  std::string registered = logs.path() + "/st-pydump/attempt_0/0/py_stack.txt";
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (read_file(registered).find("dlaunch-python-stacks pid=") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_NE(read_file(registered).find("dlaunch-python-stacks pid="), std::string::npos)
      << registered << ":\n" << read_file(registered) << agent.err();
  // And until the script runs its own code: a dump during the interpreter's start-up shows the
  // imports (seen on a loaded machine), not the function this test looks for.
  ASSERT_TRUE(wait_until([&]() { return file_exists(in_user_code); }, 30s)) << agent.err();
  RunResult r = run({kDlaunch, "dump", "--master_port", port, "--rdzv_id", "st-pydump"});
  EXPECT_EQ(r.exit.shell_code(), 0) << r.err;
  std::string dir_marker = "stacks of 1 worker(s) in ";
  size_t at = r.out.find(dir_marker);
  ASSERT_NE(at, std::string::npos) << r.out;
  std::string dir = r.out.substr(at + dir_marker.size());
  dir = dir.substr(0, dir.find('\n'));
  std::string text = read_file(dir + "/rank_0.txt");
  size_t python = text.find("--- Python stacks (faulthandler) ---");
  ASSERT_NE(python, std::string::npos) << text;
  EXPECT_NE(text.find("waiting_in_user_code", python), std::string::npos) << text;
  agent.signal(SIGTERM);
  ASSERT_TRUE(agent.wait(30s));
}

TEST(StatusEndpoint, FailureReportLinksTheTimeline) {
  TempDir logs;
  std::string port = std::to_string(free_port());
  RunResult r =
      run(cat({kDlaunch, "--nproc_per_node", "1", "--log_dir", logs.path()},
              cat(job_args(port, "st-fail"), {"--no_python", "/bin/sh", "-c", "exit 3"})));
  EXPECT_EQ(r.exit.shell_code(), 1) << r.err;
  std::string path = logs.path() + "/st-fail/events.jsonl";
  EXPECT_NE(r.err.find("Timeline of this node: " + path), std::string::npos) << r.err;
  std::string events = read_file(path);
  EXPECT_NE(events.find("\"event\":\"worker_exited\""), std::string::npos) << events;
  EXPECT_NE(events.find("\"exit_code\":3"), std::string::npos) << events;
}

// An agent that ended (its status port refuses) is listed as left, not as an error: status
// and stop exit 0 while every agent still running answers.
TEST(StatusEndpoint, AnAgentThatLeftIsListedAsLeftAndIsNoError) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        kDlaunch, "--nnodes", "2:3", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
        "--rdzv_id", "st-left", "--rdzv_conf", "last_call_timeout=0.5,keep_alive_interval=1",
        "--no_python", "/bin/sleep", "60"}));
  }
  std::vector<std::string> addrs;
  for (auto& n : nodes) addrs.push_back(endpoint_of(*n));
  RunResult js;
  ASSERT_TRUE(wait_until(
      [&]() {
        js = run({kDlaunch, "status", "--rdzv_endpoint", endpoint, "--rdzv_id", "st-left",
                  "--json"});
        return js.exit.shell_code() == 0 && nlohmann::json::parse(js.out)["agents"].size() == 3;
      },
      60s))
      << js.out << js.err;
  // One that does not host the store ends.
  size_t gone = nodes[0]->err().find("hosting the job's store") == std::string::npos ? 0 : 1;
  nodes[gone]->signal(SIGKILL);
  ASSERT_TRUE(nodes[gone]->wait(30s));
  RunResult table = run({kDlaunch, "status", "--rdzv_endpoint", endpoint, "--rdzv_id", "st-left"});
  EXPECT_EQ(table.exit.shell_code(), 0) << table.out << table.err;
  EXPECT_NE(table.out.find(addrs[gone] + " "), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("left (its agent ended)"), std::string::npos) << table.out;
  EXPECT_EQ(table.out.find("unreachable"), std::string::npos) << table.out;
  RunResult stop = run({kDlaunch, "stop", "--rdzv_endpoint", endpoint, "--rdzv_id", "st-left"});
  EXPECT_EQ(stop.exit.shell_code(), 0) << stop.out << stop.err;
  EXPECT_NE(stop.out.find("left the job already"), std::string::npos) << stop.out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i != gone) EXPECT_TRUE(nodes[i]->wait(60s)) << nodes[i]->err();
  }
}

TEST(StatusEndpoint, SeveralNodesShowInOneStatusAndRestartTogether) {
  TempDir logs;
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        kDlaunch, "--nnodes", "2", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
        "--rdzv_endpoint", endpoint, "--rdzv_id", "st-multi", "--max_restarts", "1", "--log_dir",
        logs.path(), "--no_python", "/bin/sleep", "60"}));
  }
  std::vector<std::string> addrs;
  for (auto& n : nodes) {
    addrs.push_back(endpoint_of(*n));
    ASSERT_TRUE(workers_running(addrs.back(), 2)) << n->err();
  }
  // Each agent publishes its endpoint once its first round formed, from a helper thread.
  RunResult js;
  nlohmann::json j;
  ASSERT_TRUE(wait_until(
      [&]() {
        js = run(
            {kDlaunch, "status", "--rdzv_endpoint", endpoint, "--rdzv_id", "st-multi", "--json"});
        if (js.exit.shell_code() != 0) return false;
        j = nlohmann::json::parse(js.out);
        return j["agents"].size() == 2;
      },
      30s))
      << js.out << js.err;
  std::set<int64_t> ranks;
  int hosting = 0;
  for (const auto& a : j["agents"]) {
    for (const auto& w : a["workers"]) ranks.insert(w["rank"].get<int64_t>());
    hosting += a["store"].is_null() ? 0 : 1;
  }
  EXPECT_EQ(ranks, (std::set<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(hosting, 1) << "one agent hosts the store and reports its statistics";

  RunResult restart =
      run({kDlaunch, "restart", "--rdzv_endpoint", endpoint, "--rdzv_id", "st-multi"});
  EXPECT_EQ(restart.exit.shell_code(), 0) << restart.err;
  for (const auto& addr : addrs) {
    EXPECT_TRUE(wait_until([&]() { return get_json(addr, "/status")["attempt"] == 1; }, 60s))
        << "every node restarts";
  }
  RunResult ev = run({kDlaunch, "status", "--rdzv_endpoint", endpoint, "--rdzv_id", "st-multi",
                      "--events", "--json"});
  ASSERT_EQ(ev.exit.shell_code(), 0) << ev.err;
  auto events = nlohmann::json::parse(ev.out);
  std::set<int> agents_seen;
  double last = 0;
  int closed_rounds = 0;
  for (const auto& e : events) {
    agents_seen.insert(e["agent_pid"].get<int>());
    EXPECT_GE(e["time"].get<double>(), last) << "ordered by time";
    last = e["time"].get<double>();
    if (e["event"] == "rendezvous_closed") {
      ++closed_rounds;
      EXPECT_EQ(e["members"].size(), 2u);
    }
  }
  EXPECT_EQ(agents_seen.size(), 2u);
  EXPECT_EQ(closed_rounds, 4) << "two rounds on each of two nodes";
  RunResult stop = run({kDlaunch, "stop", "--rdzv_endpoint", endpoint, "--rdzv_id", "st-multi"});
  EXPECT_EQ(stop.exit.shell_code(), 0) << stop.err;
  for (auto& n : nodes) {
    auto e = n->wait(60s);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->shell_code(), 143) << n->err();
  }
}

// A real Prometheus server scrapes the agent's /metrics and answers a query for a series; promtool
// checks the exposition.
TEST(StatusEndpoint, PrometheusScrapesTheAgent) {
  if (!file_exists("/usr/bin/prometheus") || !file_exists("/usr/bin/promtool")) {
    GTEST_SKIP() << "prometheus is not installed (scripts/setup.sh --test installs it)";
  }
  TempDir logs;
  std::string port = std::to_string(free_port());
  Subprocess agent(cat({kDlaunch, "--nproc_per_node", "2", "--log_dir", logs.path()},
                       cat(job_args(port, "st-prom"), {"--no_python", "/bin/sleep", "120"})));
  std::string addr = endpoint_of(agent);
  ASSERT_TRUE(workers_running(addr, 2)) << agent.err();

  HttpReply metrics = http_request(addr, "GET", "/metrics");
  { std::ofstream(logs.file("metrics.txt")) << metrics.body; }
  RunResult check = run({"/bin/sh", "-c", "promtool check metrics < " + logs.file("metrics.txt")});
  EXPECT_EQ(check.exit.shell_code(), 0) << check.out << check.err;

  std::string prom_port = std::to_string(free_port());
  {
    std::ofstream cfg(logs.file("prometheus.yml"));
    cfg << "global:\n  scrape_interval: 1s\n"
        << "scrape_configs:\n  - job_name: dlaunch\n    static_configs:\n"
        << "      - targets: ['" << addr << "']\n";
  }
  Subprocess prometheus({"/usr/bin/prometheus", "--config.file=" + logs.file("prometheus.yml"),
                         "--storage.tsdb.path=" + logs.file("tsdb"),
                         "--web.listen-address=127.0.0.1:" + prom_port});
  std::string prom = "127.0.0.1:" + prom_port;
  nlohmann::json answer;
  bool found = wait_until(
      [&]() {
        try {
          HttpReply r = http_request(
              prom, "GET", "/api/v1/query?query=dlaunch_worker_up%7Bjob%3D%22dlaunch%22%7D");
          if (r.status != 200) return false;
          answer = nlohmann::json::parse(r.body);
          return answer["data"]["result"].size() == 2;
        } catch (const std::exception&) {
          return false;
        }
      },
      60s);
  ASSERT_TRUE(found) << answer.dump() << "\n" << prometheus.err();
  std::set<std::string> ranks;
  for (const auto& series : answer["data"]["result"]) {
    ranks.insert(series["metric"]["rank"].get<std::string>());
    EXPECT_EQ(series["metric"]["run_id"], "st-prom");
    EXPECT_EQ(series["value"][1], "1");
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1"}));
  // Prometheus saw the target healthy.
  HttpReply targets = http_request(prom, "GET", "/api/v1/targets");
  EXPECT_NE(targets.body.find("\"health\":\"up\""), std::string::npos) << targets.body;
  agent.signal(SIGTERM);
  ASSERT_TRUE(agent.wait(30s));
}

}  // namespace
}  // namespace dlaunch::testing
