// What the status endpoint costs, measured on real agents (issue 13's targets):
//   1. GET /status and GET /metrics on an agent supervising 64 workers (/bin/sleep): median
//      and p99 latency over --runs requests each (target: <= 5 ms);
//   2. that agent's RSS (VmRSS, VmHWM) with the endpoint on (target: <= 10 MiB);
//   3. `dlaunch status` over a 32-agent c10d job on this host (one worker each): median wall
//      time of the whole command, store lookup and 32 HTTP requests included (target: 200 ms).
//
//   build/bin/status_bench [--runs N] [--agents N] [--workers N]
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_support.h"
#include "launcher/status/http_client.h"

namespace {

using namespace std::chrono_literals;
using dlaunch::bench::mono_ns;

const std::string kDlaunch = DLAUNCH_BIN;

// A child with stdout/stderr to a file; killed (SIGTERM, then SIGKILL) on destruction.
struct Child {
  pid_t pid = -1;
  std::string log;
  Child(const std::vector<std::string>& argv, const std::string& log_path) : log(log_path) {
    pid = fork();
    if (pid == 0) {
      FILE* f = std::fopen(log_path.c_str(), "w");
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
      std::vector<char*> a;
      for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
      a.push_back(nullptr);
      execv(a[0], a.data());
      _exit(127);
    }
  }
  ~Child() {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) return;
      std::this_thread::sleep_for(50ms);
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  std::string text() const {
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string endpoint() const {
    for (int i = 0; i < 600; ++i) {
      std::string t = text();
      size_t at = t.find("status endpoint: http://");
      if (at != std::string::npos) {
        at += 24;
        return t.substr(at, t.find("/status", at) - at);
      }
      std::this_thread::sleep_for(50ms);
    }
    return "";
  }
};

int64_t proc_kb(pid_t pid, const char* field) {
  std::ifstream f(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field, 0) == 0) return std::atoll(line.c_str() + std::strlen(field));
  }
  return -1;
}

bool all_running(const std::string& addr, size_t n) {
  for (int i = 0; i < 1200; ++i) {
    try {
      auto j = nlohmann::json::parse(dlaunch::http_request(addr, "GET", "/status").body);
      size_t running = 0;
      for (const auto& w : j["workers"]) running += w["state"] == "running";
      if (running == n) return true;
    } catch (const std::exception&) {
    }
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

std::string tmp_dir() {
  const char* t = std::getenv("TMPDIR");
  std::string templ = std::string(t && *t ? t : "/tmp") + "/status_bench_XXXXXX";
  return mkdtemp(templ.data()) ? templ : "/tmp";
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 200, agents = 32, workers = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--runs") runs = std::atoi(argv[i + 1]);
    if (a == "--agents") agents = std::atoi(argv[i + 1]);
    if (a == "--workers") workers = std::atoi(argv[i + 1]);
  }
  std::string dir = tmp_dir();
  {
    std::string port = std::to_string(dlaunch::bench::free_port());
    Child agent({kDlaunch, "--nproc_per_node", std::to_string(workers), "--master_port", port,
                 "--rdzv_id", "bench", "--no_python", "/bin/sleep", "600"},
                dir + "/agent.log");
    std::string addr = agent.endpoint();
    if (addr.empty() || !all_running(addr, static_cast<size_t>(workers))) {
      std::fprintf(stderr, "the agent did not start its workers:\n%s\n", agent.text().c_str());
      return 1;
    }
    for (const char* target : {"/status", "/metrics"}) {
      std::vector<double> ms;
      size_t bytes = 0;
      for (int i = 0; i < runs; ++i) {
        int64_t t0 = mono_ns();
        auto r = dlaunch::http_request(addr, "GET", target);
        ms.push_back(static_cast<double>(mono_ns() - t0) / 1e6);
        bytes = r.body.size();
      }
      fmt::print("GET {:<8} {} workers: median {:.2f} ms, p99 {:.2f} ms ({} requests, {} bytes)\n",
                 target, workers, percentile(ms, 0.5), percentile(ms, 0.99), runs, bytes);
    }
    fmt::print("agent RSS with the endpoint on, {} workers: VmRSS {:.1f} MiB, VmHWM {:.1f} MiB\n",
               workers, proc_kb(agent.pid, "VmRSS:") / 1024.0,
               proc_kb(agent.pid, "VmHWM:") / 1024.0);
  }
  {
    std::string endpoint = fmt::format("127.0.0.1:{}", dlaunch::bench::free_port());
    std::vector<std::unique_ptr<Child>> nodes;
    for (int i = 0; i < agents; ++i) {
      nodes.push_back(std::make_unique<Child>(
          std::vector<std::string>{kDlaunch, "--nnodes", std::to_string(agents), "--nproc_per_node",
                                   "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
                                   "--rdzv_id", "bench32", "--no_python", "/bin/sleep", "600"},
          fmt::format("{}/node{}.log", dir, i)));
    }
    for (auto& n : nodes) {
      std::string addr = n->endpoint();
      if (addr.empty() || !all_running(addr, 1)) {
        std::fprintf(stderr, "an agent did not start:\n%s\n", n->text().c_str());
        return 1;
      }
    }
    std::vector<double> ms;
    for (int i = 0; i < 10; ++i) {
      int64_t t0 = mono_ns();
      std::string cmd =
          fmt::format("{} status --rdzv_endpoint {} --rdzv_id bench32 > {}/status.out", kDlaunch,
                      endpoint, dir);
      int rc = std::system(cmd.c_str());
      ms.push_back(static_cast<double>(mono_ns() - t0) / 1e6);
      if (rc != 0) {
        std::fprintf(stderr, "dlaunch status failed (%d)\n", rc);
        return 1;
      }
    }
    std::ifstream out(dir + "/status.out");
    std::string first;
    std::getline(out, first);
    fmt::print(
        "dlaunch status, {} agents on one host: median {:.1f} ms, max {:.1f} ms (10 runs; "
        "'{}')\n",
        agents, percentile(ms, 0.5), percentile(ms, 1.0), first);
  }
  return 0;
}
