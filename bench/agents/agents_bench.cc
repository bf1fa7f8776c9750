// Whole agents at scale: N real dlaunch processes on this host (one per "node", each with
// --nproc_per_node 1 and a worker that exits at once) forming one job over static or c10d
// rendezvous, beside torchrun 1.13's c10d agents from the same run.
//
// Per job, measured on CLOCK_MONOTONIC from just before the first agent is spawned:
//   first    until the first worker began (static: no agent starts its worker before all N
//            joined, so this bounds the rendezvous itself);
//   workers  until the last worker began (each worker prints a CLOCK_MONOTONIC stamp as its first
//            act: bench/launch/stamp_worker.cc, "exit" mode = print one line, exit 0, as cheap as
//            /bin/true); implies every agent finished its rendezvous and spawned its worker;
//   exit     until the last agent exited (all must exit 0): includes the exit barrier, where
//            every agent waits for the others before leaving.
//   CPU      user + system CPU of the agents with their workers (and everything else they
//            reaped), whole life, per agent: getrusage(RUSAGE_CHILDREN) around the job. On a
//            shared 2-core host the steadiest figure of what the agents cost.
// And from the agents' own log lines (wall clock, millisecond resolution, on stderr):
//   up       until the last agent logged its first line (it was started and set up);
//   rdzv     until the first / the last agent logged "attempt 0: starting", i.e. learned that
//            the round completed and began to start its worker.
// Agents are posix_spawn'ed back to back; their stdout goes to one O_APPEND file (dlaunch writes
// each worker line with one write, so lines never mix), their stderr to another, shown on
// failure.
//
//   agents_bench [--agents 2,8,32,128,512,1024] [--backend static|c10d|both] [--repeat 3]
//                [--repeat_large 1] [--torchrun 32] [--torchrun_repeat 1] [--true]
//                [--timeout 300] [--keep]
//   --repeat_large  runs for N >= 512 (they take the machine for seconds each)
//   --torchrun N    torchrun peer with N agents (0: none)
//   --true          workers are /bin/true (then only the exit time is measured)
//   --keep          keep each job's stdout/stderr files (their directory is printed)
//   --floor         also, per N, this host's fork/exec floor: N idle processes (forked from
//                   the bench) woken at once, each fork()s and execs one stamp_worker and waits
//                   for it, as an agent does with no rendezvous; printed as "floor": the time
//                   from the wake to the last worker's stamp. Compare it with the agents'
//                   "last agent up -> workers started" (issue 16's target is 0.5 s).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
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
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_support.h"

extern char** environ;

namespace {

using dlaunch::bench::free_port;
using dlaunch::bench::mono_ns;
using dlaunch::bench::parse_int_list;

bool g_keep = false;  // --keep

const std::string kDlaunch = DLAUNCH_BIN;
const std::string kStamp = STAMP_WORKER_BIN;
const std::string kPython = "/usr/bin/python3";

struct JobResult {
  bool ok = false;
  double exit_s = -1;                  // first spawn -> last agent exited
  std::optional<double> workers_s;     // first spawn -> last worker's stamp
  std::optional<double> first_worker_s;  // first spawn -> first worker's stamp
  std::optional<double> up_s;          // first spawn -> the last agent's first log line
  std::optional<double> rdzv_first_s;  // first spawn -> first "attempt 0: starting" line
  std::optional<double> rdzv_last_s;   // first spawn -> last "attempt 0: starting" line
  double cpu_ms_per_agent = -1;        // user + system CPU of the reaped agents, their workers
                                       // (and whatever else they reaped), whole life, per agent
  int failed = 0;                      // agents that exited, but not with 0
  int killed = 0;                      // agents still running at the deadline (SIGKILLed)
  std::string err_tail;
};

// User + system CPU seconds of this process's reaped children and their reaped descendants
// (getrusage(RUSAGE_CHILDREN)). Steadier than wall times on a shared 2-core host: what a job's
// agents and workers cost, whenever it ran.
double children_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_CHILDREN, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

std::string tail_of(const std::string& path, size_t bytes) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  std::string text = s.str();
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

// The wall clock as the agents' log lines print it: seconds since local midnight.
double wall_of_day() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm t{};
  localtime_r(&ts.tv_sec, &t);
  return t.tm_hour * 3600.0 + t.tm_min * 60.0 + t.tm_sec + ts.tv_nsec / 1e9;
}

// "[dlaunch HH:MM:SS.mmm X] text": the time of day, or nullopt for other lines.
std::optional<double> log_time(const std::string& line) {
  int h, m, sec, ms;
  if (std::sscanf(line.c_str(), "[dlaunch %d:%d:%d.%d", &h, &m, &sec, &ms) != 4) return {};
  return h * 3600.0 + m * 60.0 + sec + ms / 1000.0;
}

// Spawns every argv at once, waits for all (SIGKILL after `timeout_s`), reads the stamps.
JobResult run_job(const std::vector<std::vector<std::string>>& argvs, int expected_stamps,
                  double timeout_s) {
  char dir_template[] = "/tmp/agents_bench_XXXXXX";
  std::string dir = mkdtemp(dir_template);
  std::string out_path = dir + "/stdout", err_path = dir + "/stderr";
  int out_fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
  posix_spawn_file_actions_adddup2(&actions, err_fd, 2);

  JobResult r;
  std::set<pid_t> running;
  const double cpu0 = children_cpu_s();
  int64_t t0 = mono_ns();
  double wall0 = wall_of_day();
  for (const auto& argv : argvs) {
    std::vector<std::string> args = argv;
    std::vector<char*> cargv;
    for (auto& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
    if (rc != 0) {
      std::fprintf(stderr, "posix_spawn %s: %s\n", cargv[0], std::strerror(rc));
      ++r.failed;
      continue;
    }
    running.insert(pid);
  }
  posix_spawn_file_actions_destroy(&actions);
  close(out_fd);
  close(err_fd);

  // Reap; WNOHANG polling every 0.2 ms costs little next to the figures and allows a deadline.
  // Once an agent failed the run is lost: the others would sit in the exit barrier (300 s), so
  // they get kFailedGrace to finish, then SIGKILL.
  constexpr int64_t kFailedGrace = 5'000'000'000;
  int64_t deadline = t0 + static_cast<int64_t>(timeout_s * 1e9);
  int64_t last_exit = t0;
  bool killed = false;
  while (!running.empty()) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      last_exit = mono_ns();
      running.erase(pid);
      if (killed && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) continue;  // ours
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (r.failed == 0) deadline = std::min(deadline, last_exit + kFailedGrace);
        ++r.failed;
      }
      continue;
    }
    if (!killed && mono_ns() > deadline) {
      r.killed = static_cast<int>(running.size());
      for (pid_t p : running) kill(p, SIGKILL);
      killed = true;
    }
    usleep(200);
  }
  r.exit_s = static_cast<double>(last_exit - t0) / 1e9;
  if (!argvs.empty()) r.cpu_ms_per_agent = (children_cpu_s() - cpu0) * 1e3 / argvs.size();

  std::ifstream out(out_path);
  std::string line;
  int64_t latest = 0, earliest = 0;
  int stamps = 0;
  while (std::getline(out, line)) {
    size_t at = line.find("stamp ");
    long long ns = 0;
    if (at != std::string::npos && std::sscanf(line.c_str() + at, "stamp %lld", &ns) == 1) {
      latest = std::max<int64_t>(latest, ns);
      earliest = earliest == 0 ? ns : std::min<int64_t>(earliest, ns);
      ++stamps;
    }
  }
  if (expected_stamps > 0 && stamps == expected_stamps) {
    r.workers_s = static_cast<double>(latest - t0) / 1e9;
    r.first_worker_s = static_cast<double>(earliest - t0) / 1e9;
  }
  // Each agent's first line is "setting OMP_NUM_THREADS..." (prepare()); "attempt 0: starting"
  // follows the completed round. Lines of one agent are not told apart from another's: the
  // counts must match the number of agents for a figure to be given.
  {
    std::ifstream err(err_path);
    int ups = 0, starts = 0;
    double up = 0, rdzv_first = 1e30, rdzv_last = 0;
    while (std::getline(err, line)) {
      auto t = log_time(line);
      if (!t) continue;
      double rel = *t - wall0;
      if (line.find("setting OMP_NUM_THREADS") != std::string::npos) {
        ++ups;
        up = std::max(up, rel);
      } else if (line.find("attempt 0: starting") != std::string::npos) {
        ++starts;
        rdzv_first = std::min(rdzv_first, rel);
        rdzv_last = std::max(rdzv_last, rel);
      }
    }
    int agents = static_cast<int>(argvs.size());
    if (ups == agents) r.up_s = up;
    if (starts == agents) {
      r.rdzv_first_s = rdzv_first;
      r.rdzv_last_s = rdzv_last;
    }
  }
  r.ok = r.failed == 0 && r.killed == 0 && (expected_stamps == 0 || r.workers_s.has_value());
  if (!r.ok) {
    // The agents' error lines (the cause), then the tail (the consequences).
    std::ifstream err(err_path);
    int errors = 0;
    while (std::getline(err, line)) {
      if (line.find(" E] ") != std::string::npos && errors++ < 5) r.err_tail += line + "\n";
    }
    if (errors > 5) r.err_tail += "(" + std::to_string(errors) + " error lines in all)\n";
    r.err_tail += "...\n" + tail_of(err_path, 1500);
    if (expected_stamps > 0 && stamps != expected_stamps) {
      r.err_tail += "\n(" + std::to_string(stamps) + " of " + std::to_string(expected_stamps) +
                    " worker stamps)";
    }
  }
  if (g_keep) {
    std::fprintf(stderr, "agents' output kept in %s\n", dir.c_str());
  } else {
    unlink(out_path.c_str());
    unlink(err_path.c_str());
    rmdir(dir.c_str());
  }
  return r;
}

// The fork/exec floor (--floor): seconds from waking n idle processes at once to the last of
// their n stamp_worker children printing its stamp, or nullopt when a stamp is missing; in
// `cpu_ms_per_process`, each process's CPU with its worker's, whole life (as the agents').
std::optional<double> fork_exec_floor(int n, double& cpu_ms_per_process) {
  const double cpu0 = children_cpu_s();
  char path_template[] = "/tmp/agents_floor_XXXXXX";
  int out_fd = mkstemp(path_template);
  std::string out_path = path_template;
  int go[2], up[2];
  if (out_fd < 0 || pipe(go) != 0 || pipe(up) != 0) return {};
  std::vector<pid_t> parents;
  for (int i = 0; i < n; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      // An "agent": says it is up, sleeps until the go pipe closes, then starts its worker.
      close(go[1]);
      close(up[0]);
      dup2(out_fd, 1);
      char c = 1;
      if (write(up[1], &c, 1) != 1) _exit(3);
      while (read(go[0], &c, 1) > 0) {
      }
      pid_t worker = fork();
      if (worker == 0) {
        char* argv[] = {const_cast<char*>(kStamp.c_str()), const_cast<char*>("exit"), nullptr};
        execv(argv[0], argv);
        _exit(127);
      }
      int status = 0;
      waitpid(worker, &status, 0);
      _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
    }
    if (pid > 0) parents.push_back(pid);
  }
  close(up[1]);
  close(go[0]);
  char c;
  for (int i = 0; i < static_cast<int>(parents.size()); ++i) {
    if (read(up[0], &c, 1) != 1) break;
  }
  int64_t t0 = mono_ns();
  close(go[1]);
  bool ok = static_cast<int>(parents.size()) == n;
  for (pid_t p : parents) {
    int status = 0;
    waitpid(p, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  close(up[0]);
  close(out_fd);
  std::ifstream out(out_path);
  std::string line;
  int64_t latest = 0;
  int stamps = 0;
  while (std::getline(out, line)) {
    long long ns = 0;
    if (std::sscanf(line.c_str(), "stamp %lld", &ns) == 1) {
      latest = std::max<int64_t>(latest, ns);
      ++stamps;
    }
  }
  unlink(out_path.c_str());
  cpu_ms_per_process = (children_cpu_s() - cpu0) * 1e3 / n;
  if (!ok || stamps != n) return {};
  return static_cast<double>(latest - t0) / 1e9;
}

std::vector<std::string> worker_argv(bool use_true) {
  if (use_true) return {"/bin/true"};
  return {kStamp, "exit"};
}

std::vector<std::vector<std::string>> dlaunch_job(const std::string& backend, int n, int port,
                                                  const std::string& run_id, bool use_true) {
  std::vector<std::vector<std::string>> argvs;
  for (int k = 0; k < n; ++k) {
    std::vector<std::string> a = {kDlaunch};
    if (backend == "static") {
      a.insert(a.end(), {"--nnodes", std::to_string(n), "--node_rank", std::to_string(k),
                         "--master_addr", "127.0.0.1", "--master_port", std::to_string(port)});
    } else {
      a.insert(a.end(), {"--nnodes", std::to_string(n) + ":" + std::to_string(n),
                         "--rdzv_backend", "c10d", "--rdzv_endpoint",
                         "127.0.0.1:" + std::to_string(port)});
    }
    a.insert(a.end(), {"--rdzv_id", run_id, "--rdzv_conf", "join_timeout=120",
                       "--nproc_per_node", "1", "--no_python"});
    for (auto& w : worker_argv(use_true)) a.push_back(w);
    argvs.push_back(a);
  }
  return argvs;
}

// torchrun 1.13 crashes at argument parsing on Python 3.11 unless -r and -t are given (only 1
// and 2 parse); -r 2 -t 2 leaves stdout, where the stamps go, untouched.
std::vector<std::vector<std::string>> torchrun_job(int n, int port, const std::string& run_id,
                                                   bool use_true) {
  std::vector<std::vector<std::string>> argvs;
  for (int k = 0; k < n; ++k) {
    std::vector<std::string> a = {kPython, "-m", "torch.distributed.run", "--nnodes",
                                  std::to_string(n), "--nproc_per_node", "1", "--rdzv_backend",
                                  "c10d", "--rdzv_endpoint", "127.0.0.1:" + std::to_string(port),
                                  "--rdzv_id", run_id, "-r", "2", "-t", "2", "--no_python"};
    for (auto& w : worker_argv(use_true)) a.push_back(w);
    argvs.push_back(a);
  }
  return argvs;
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string range(const std::vector<double>& v) {
  if (v.size() < 2) return "";
  char buf[64];
  std::snprintf(buf, sizeof(buf), " (%.3f-%.3f)", *std::min_element(v.begin(), v.end()),
                *std::max_element(v.begin(), v.end()));
  return buf;
}

struct Figures {
  std::vector<double> exit_s, workers_s, first_worker_s, up_s, rdzv_first_s, rdzv_last_s;
  std::vector<double> up_to_workers_s;  // per run: the last agent up -> the last worker began
  std::vector<double> cpu_ms_per_agent;
  int failures = 0;
};

std::string med(const std::vector<double>& v) {
  if (v.empty()) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", median(v));
  return buf;
}

void print_row(const std::string& name, int n, const Figures& f) {
  std::printf(
      "%-9s %5d agents: agents up %s s; rendezvous done first %s, last %s%s s; "
      "first worker %s s, workers started %s%s s [%zu runs] (%s%s s after the last agent "
      "was up), all exited 0 %s%s s [%zu runs; %d failed]; CPU per agent %s%s ms (with its "
      "worker, whole life)\n",
      name.c_str(), n, med(f.up_s).c_str(), med(f.rdzv_first_s).c_str(), med(f.rdzv_last_s).c_str(),
      range(f.rdzv_last_s).c_str(), med(f.first_worker_s).c_str(), med(f.workers_s).c_str(),
      range(f.workers_s).c_str(), f.workers_s.size(), med(f.up_to_workers_s).c_str(),
      range(f.up_to_workers_s).c_str(), med(f.exit_s).c_str(), range(f.exit_s).c_str(),
      f.exit_s.size(), f.failures, med(f.cpu_ms_per_agent).c_str(),
      range(f.cpu_ms_per_agent).c_str());
  std::fflush(stdout);
}

// Every worker's start counts even when the run failed later (at exit); the exit time only
// when every agent exited 0.
void record(Figures& f, const JobResult& r, const std::string& what) {
  if (r.workers_s) f.workers_s.push_back(*r.workers_s);
  if (r.first_worker_s) f.first_worker_s.push_back(*r.first_worker_s);
  if (r.up_s) f.up_s.push_back(*r.up_s);
  if (r.up_s && r.workers_s) f.up_to_workers_s.push_back(*r.workers_s - *r.up_s);
  if (r.cpu_ms_per_agent >= 0) f.cpu_ms_per_agent.push_back(r.cpu_ms_per_agent);
  if (r.rdzv_first_s) f.rdzv_first_s.push_back(*r.rdzv_first_s);
  if (r.rdzv_last_s) f.rdzv_last_s.push_back(*r.rdzv_last_s);
  if (!r.ok) {
    ++f.failures;
    std::fprintf(stderr, "%s failed (%d agents exited non-zero, %d killed at the deadline); "
                 "stderr tail:\n%s\n", what.c_str(), r.failed, r.killed, r.err_tail.c_str());
    return;
  }
  f.exit_s.push_back(r.exit_s);
}

std::string load() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> agents = {2, 8, 32, 128, 512, 1024};
  std::vector<std::string> backends = {"static", "c10d"};
  int repeat = 3, repeat_large = 1, torchrun_n = 32, torchrun_repeat = 1;
  double timeout_s = 300;
  bool use_true = false, floor = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--agents") agents = parse_int_list(next());
    else if (a == "--backend") {
      std::string b = next();
      backends = b == "both" ? std::vector<std::string>{"static", "c10d"}
                             : std::vector<std::string>{b};
    } else if (a == "--repeat") repeat = std::stoi(next());
    else if (a == "--repeat_large") repeat_large = std::stoi(next());
    else if (a == "--torchrun") torchrun_n = std::stoi(next());
    else if (a == "--torchrun_repeat") torchrun_repeat = std::stoi(next());
    else if (a == "--timeout") timeout_s = std::stod(next());
    else if (a == "--true") use_true = true;
    else if (a == "--keep") g_keep = true;
    else if (a == "--floor") floor = true;
    else {
      std::fprintf(stderr,
                   "usage: agents_bench [--agents 2,8,...] [--backend static|c10d|both] "
                   "[--repeat N] [--repeat_large N] [--torchrun N] [--torchrun_repeat N] "
                   "[--true] [--timeout S] [--keep] [--floor]\n");
      return 2;
    }
  }
  // The store host needs ~2 fds per agent; this process none per agent, but the agents inherit
  // the limit.
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  std::printf("fd limit %llu; load average at start %s; worker: %s\n",
              static_cast<unsigned long long>(lim.rlim_cur), load().c_str(),
              use_true ? "/bin/true" : "stamp_worker exit");
  std::fflush(stdout);

  int stamps_per_agent = use_true ? 0 : 1;
  int run = 0;
  for (int n : agents) {
    for (const auto& backend : backends) {
      Figures f;
      int reps = n >= 512 ? repeat_large : repeat;
      for (int r = 0; r < reps; ++r) {
        std::string id = "agents" + std::to_string(getpid()) + "_" + std::to_string(run++);
        auto res = run_job(dlaunch_job(backend, n, free_port(), id, use_true),
                           n * stamps_per_agent, timeout_s);
        record(f, res, "dlaunch " + backend + " " + std::to_string(n));
      }
      print_row(backend, n, f);
    }
    if (floor) {
      std::vector<double> fl, cpu;
      for (int r = 0; r < (n >= 512 ? repeat_large : repeat); ++r) {
        double ms = -1;
        if (auto s = fork_exec_floor(n, ms)) fl.push_back(*s);
        if (ms >= 0) cpu.push_back(ms);
      }
      std::printf(
          "floor     %5d idle processes woken at once, each fork/exec one stamp_worker: "
          "last worker started %s%s s after the wake [%zu runs]; CPU per process %s%s ms "
          "(with its worker, whole life)\n",
          n, med(fl).c_str(), range(fl).c_str(), fl.size(), med(cpu).c_str(),
          range(cpu).c_str());
      std::fflush(stdout);
    }
  }

  if (torchrun_n > 0) {
    std::printf("load average before torchrun: %s\n", load().c_str());
    Figures tf;
    Figures df;  // dlaunch c10d at the same N, interleaved with torchrun's runs
    for (int r = 0; r < torchrun_repeat; ++r) {
      std::string id = "torchrun" + std::to_string(getpid()) + "_" + std::to_string(run++);
      auto res = run_job(torchrun_job(torchrun_n, free_port(), id, use_true),
                         torchrun_n * stamps_per_agent, timeout_s);
      record(tf, res, "torchrun " + std::to_string(torchrun_n));
      id = "agents" + std::to_string(getpid()) + "_" + std::to_string(run++);
      res = run_job(dlaunch_job("c10d", torchrun_n, free_port(), id, use_true),
                    torchrun_n * stamps_per_agent, timeout_s);
      record(df, res, "dlaunch c10d " + std::to_string(torchrun_n));
    }
    print_row("torchrun", torchrun_n, tf);
    print_row("c10d", torchrun_n, df);
    if (!tf.exit_s.empty() && !df.exit_s.empty()) {
      std::printf("ratio torchrun / dlaunch (c10d, %d agents, interleaved runs): all exited %.0fx",
                  torchrun_n, median(tf.exit_s) / median(df.exit_s));
      if (!tf.workers_s.empty() && !df.workers_s.empty()) {
        std::printf(", workers started %.0fx", median(tf.workers_s) / median(df.workers_s));
      }
      std::printf("\n");
    }
    std::printf("load average at end: %s\n", load().c_str());
  }
  return 0;
}
