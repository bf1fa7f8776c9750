// Rendezvous completion time vs number of agents: N processes (one per agent, forked), each
// with its own store connection and rendezvous handler, meeting over one TcpStoreServer on
// 127.0.0.1. Time = from the first fork to the last agent's next_rendezvous() returning.
//
//   rendezvous_bench [--backend static|c10d] [--agents 2,8,32,128,512,1024] [--repeat 3]
//   rendezvous_bench --elastic          # --nnodes 2:4 with 2 agents (completes after last call)
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_support.h"
#include "common/log.h"
#include "rendezvous/handlers/rendezvous_registry.h"
#include "rendezvous/tcp/tcp_store_server.h"

using namespace dlaunch;

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Forks `n` agents; returns seconds until the last completed, or -1 if any failed.
double run_once(const std::string& backend, int n, int64_t min_nodes, int64_t max_nodes,
                const std::string& run_id) {
  // One store server per job, as the node-0 / endpoint agent hosts it.
  TcpStoreServer server(TcpStoreServerOptions{});
  uint16_t port = server.start();
  int p[2];
  if (pipe(p) != 0) return -1;
  int64_t start = now_ns();
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      ::close(p[0]);
      int64_t done = -1;
      try {
        RendezvousParams params;
        params.backend = backend;
        params.run_id = run_id;
        params.min_nodes = min_nodes;
        params.max_nodes = max_nodes;
        params.endpoint = "127.0.0.1:" + std::to_string(port);
        params.host = "agent" + std::to_string(i);
        params.node_rank = i;
        params.config = {{"join_timeout", "120"}};
        auto handler = create_rendezvous_handler(params);
        auto result = handler->next_rendezvous();
        done = now_ns();
        if (result.group_world_size != n) done = -1;
        (void)!write(p[1], &done, sizeof(done));
        handler->shutdown();
        _exit(done > 0 ? 0 : 1);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "agent %d: %s\n", i, e.what());
      }
      (void)!write(p[1], &done, sizeof(done));
      _exit(1);
    }
    pids.push_back(pid);
  }
  ::close(p[1]);
  int64_t last = 0;
  bool ok = true;
  for (int i = 0; i < n; ++i) {
    int64_t t;
    if (read(p[0], &t, sizeof(t)) != sizeof(t) || t < 0) {
      ok = false;
      continue;
    }
    last = std::max(last, t);
  }
  ::close(p[0]);
  for (auto pid : pids) waitpid(pid, nullptr, 0);
  return ok ? (last - start) / 1e9 : -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend = "static";
  std::vector<int> agents = {2, 8, 32, 128, 512, 1024};
  int repeat = 3;
  bool elastic = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--backend" && i + 1 < argc) backend = argv[++i];
    else if (a == "--agents" && i + 1 < argc) agents = bench::parse_int_list(argv[++i]);
    else if (a == "--repeat" && i + 1 < argc) repeat = std::stoi(argv[++i]);
    else if (a == "--elastic") elastic = true;
    else {
      std::fprintf(stderr, "usage: rendezvous_bench [--backend static|c10d] [--agents 2,8,...] "
                           "[--repeat N] [--elastic]\n");
      return 2;
    }
  }
  set_log_level(LogLevel::kWarning);
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  int run = 0;
  if (elastic) {
    std::vector<double> times;
    for (int r = 0; r < repeat; ++r) {
      times.push_back(run_once("c10d", 2, 2, 4, "elastic" + std::to_string(run++)));
    }
    std::sort(times.begin(), times.end());
    std::printf("c10d --nnodes 2:4, 2 agents, last_call_timeout 1 s: median %.3f s "
                "(target <= 1.5 s; torchrun 1.13 at its defaults: 32 s per the issue)\n",
                times[times.size() / 2]);
    return 0;
  }
  std::printf("backend %s, one process per agent, median of %d\n", backend.c_str(), repeat);
  for (int n : agents) {
    std::vector<double> times;
    for (int r = 0; r < repeat; ++r) {
      times.push_back(run_once(backend, n, n, n, backend + std::to_string(run++)));
    }
    std::sort(times.begin(), times.end());
    std::printf("%5d agents: median %.3f s (min %.3f, max %.3f)\n", n, times[times.size() / 2],
                times.front(), times.back());
    std::fflush(stdout);
  }
  return 0;
}
