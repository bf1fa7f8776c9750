// Launch benchmarks, dlaunch beside torchrun in the same run (Debian's python3-torch 1.13 and the
// PyTorch 2.x of scripts/setup_torch2.sh, each where present):
//   1. end to end: 2 workers of /bin/true (the whole launcher: start, spawn, reap, exit);
//   2. agent start -> each worker's exec (the latest of the 2 workers' first instruction);
//   3. crash -> restarted group (rank 0 exits 1; time until the first worker of the new group);
//   4. the agent's peak RSS (VmHWM) while 2 workers sleep 1 s.
// Medians of --runs runs. Worker times come from CLOCK_MONOTONIC stamps the workers print
// (bench/launch/stamp_worker.cc), compared with the benchmark's own clock before it forks the
// launcher, so they include the launcher's own exec and start-up.
//
//   build/bin/launch_bench [--runs N] [--no_torchrun]
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_support.h"

namespace {

using dlaunch::bench::mono_ns;

const std::string kDlaunch = DLAUNCH_BIN;
const std::string kStamp = STAMP_WORKER_BIN;

struct Stamp {
  int64_t ns;
  int rank;
  int restart;
};

struct RunResult {
  int64_t t0 = 0;
  int64_t t_end = 0;
  int exit_code = -1;
  int64_t hwm_kb = 0;  // launcher's VmHWM, last sample before it exited
  std::vector<Stamp> stamps;
  double wall_s() const { return static_cast<double>(t_end - t0) / 1e9; }
};

int64_t read_hwm_kb(pid_t pid) {
  std::ifstream f(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return 0;
}

RunResult run(const std::vector<std::string>& argv, bool sample_rss) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) std::abort();
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  RunResult r;
  r.t0 = mono_ns();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    int null_fd = open("/dev/null", O_WRONLY);
    dup2(null_fd, 2);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buf[4096];
  while (true) {
    pollfd p{out[0], POLLIN, 0};
    int n = poll(&p, 1, sample_rss ? 20 : -1);
    if (sample_rss) {
      int64_t hwm = read_hwm_kb(pid);
      if (hwm > 0) r.hwm_kb = hwm;
    }
    if (n <= 0) continue;
    ssize_t got = read(out[0], buf, sizeof(buf));
    if (got <= 0) break;
    text.append(buf, static_cast<size_t>(got));
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.t_end = mono_ns();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    size_t at = line.find("stamp ");
    if (at == std::string::npos) continue;
    Stamp s{};
    if (std::sscanf(line.c_str() + at, "stamp %lld rank %d restart %d",
                    reinterpret_cast<long long*>(&s.ns), &s.rank, &s.restart) == 3) {
      r.stamps.push_back(s);
    }
  }
  return r;
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Launcher {
  std::string name;
  std::vector<std::string> prefix;  // the launcher's argv up to the program
  bool is_dlaunch;
};

// Seconds from the benchmark's fork of the launcher until the last of `n` workers of restart
// `restart` began.
std::optional<double> latest_start(const RunResult& r, int restart, int n) {
  int64_t latest = 0;
  int seen = 0;
  for (const auto& s : r.stamps) {
    if (s.restart != restart) continue;
    latest = std::max(latest, s.ns);
    ++seen;
  }
  if (seen < n) return std::nullopt;
  return static_cast<double>(latest - r.t0) / 1e9;
}

std::optional<double> crash_to_restart(const RunResult& r) {
  int64_t crash = 0, first_new = 0;
  for (const auto& s : r.stamps) {
    if (s.restart == 0 && s.rank == 0) crash = s.ns;
    if (s.restart == 1 && (first_new == 0 || s.ns < first_new)) first_new = s.ns;
  }
  if (crash == 0 || first_new == 0) return std::nullopt;
  return static_cast<double>(first_new - crash) / 1e9;
}

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 7;
  bool torchrun = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) runs = std::atoi(argv[++i]);
    if (a == "--no_torchrun") torchrun = false;
  }
  // torchrun 1.13 on Python 3.11 crashes unless -r and -t are given, and only 1 and 2 parse
  // (Std.from_str("0") and ("3") return None there): -r 2 -t 2 leaves stdout, where the
  // stamps go, untouched and sends stderr through its tee, the closest it gets to -r 0 -t 0.
  // torchrun 2.x runs at its defaults (no redirection; its monitor interval is 0.1 s there).
  std::vector<Launcher> launchers = {
      {"dlaunch", {kDlaunch, "--standalone", "--nproc_per_node", "2", "--no_python"}, true}};
  for (const auto& peer : torchrun ? dlaunch::bench::torch_peers()
                                   : std::vector<dlaunch::bench::TorchPeer>{}) {
    std::vector<std::string> base = {peer.python, "-m", "torch.distributed.run", "--standalone",
                                     "--nproc_per_node", "2"};
    std::string name = "torchrun " + peer.version;
    if (peer.is_2x()) {
      launchers.push_back({name + " (default)", cat(base, {"--no_python"}), false});
      continue;
    }
    base = cat(base, {"-r", "2", "-t", "2"});
    launchers.push_back({name + " (monitor 5 s, default)", cat(base, {"--no_python"}), false});
    launchers.push_back({name + " --monitor_interval 0.1",
                         cat(base, {"--monitor_interval", "0.1", "--no_python"}), false});
  }

  struct Figures {
    std::vector<double> e2e, start, restart, rss_mib;
  };
  std::map<std::string, Figures> figs;
  for (int i = 0; i < runs; ++i) {
    for (const auto& l : launchers) {
      auto& f = figs[l.name];
      auto e2e = run(cat(l.prefix, {"/bin/true"}), false);
      if (e2e.exit_code == 0) f.e2e.push_back(e2e.wall_s());
      auto st = run(cat(l.prefix, {kStamp, "exit"}), false);
      if (auto s = latest_start(st, 0, 2)) f.start.push_back(*s);
      std::vector<std::string> restart_prefix = l.prefix;
      restart_prefix.insert(restart_prefix.end() - 1, {"--max_restarts", "1"});
      auto rs = run(cat(restart_prefix, {kStamp, "crash-once"}), false);
      if (auto c = crash_to_restart(rs)) f.restart.push_back(*c);
      auto mem = run(cat(l.prefix, {kStamp, "sleep", "1"}), true);
      if (mem.hwm_kb > 0) f.rss_mib.push_back(static_cast<double>(mem.hwm_kb) / 1024.0);
    }
  }

  auto row = [&](const char* what, std::vector<double> Figures::*field, double scale,
                 const char* unit) {
    double ours = median(figs["dlaunch"].*field) * scale;
    std::printf("| %-34s | %10.2f %s |", what, ours, unit);
    for (size_t i = 1; i < launchers.size(); ++i) {
      double theirs = median(figs[launchers[i].name].*field) * scale;
      std::printf(" %10.2f %s (%.0fx) |", theirs, unit, ours > 0 ? theirs / ours : 0.0);
    }
    std::printf("\n");
  };
  std::printf("\nLaunch benchmarks, medians of %d runs (ratio = peer / dlaunch)\n\n", runs);
  std::printf("| %-34s | %13s |", "figure", "dlaunch");
  for (size_t i = 1; i < launchers.size(); ++i) std::printf(" %s |", launchers[i].name.c_str());
  std::printf("\n|---|---|");
  for (size_t i = 1; i < launchers.size(); ++i) std::printf("---|");
  std::printf("\n");
  row("2 x /bin/true, end to end", &Figures::e2e, 1e3, "ms");
  row("launcher start -> last worker exec", &Figures::start, 1e3, "ms");
  row("crash -> first restarted worker", &Figures::restart, 1e3, "ms");
  row("launcher peak RSS (VmHWM)", &Figures::rss_mib, 1.0, "MiB");
  return 0;
}
