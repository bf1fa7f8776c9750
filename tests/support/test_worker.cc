// dlaunch_test_worker: a small worker whose behaviour is chosen on the command line, so the
// launcher's guarantees can be tested with real processes.
//
//   dlaunch_test_worker MODE [key=value...]
//
// Modes:
//   ok                  print "ok rank=R" and exit 0
//   crash [code=N]      exit N (default 3)
//   crash-once [code=N] exit N when TORCHELASTIC_RESTART_COUNT is 0, else like ok
//   wait-once           run until stopped when TORCHELASTIC_RESTART_COUNT is 0, else like ok
//   wait-first-attempt  run until stopped when DLAUNCH_ATTEMPT is 0 (any restart, also a free
//                       one after a membership change, moves on), then print
//                       "ok rank=R world=W attempt=A" and exit 0
//   fail-when-peer-dies ready=DIR   on the first attempt (DLAUNCH_ATTEMPT 0): wait for every
//                       rank's DIR/ready.<rank>, then exit 1 as soon as one of those processes
//                       is gone (as gloo/NCCL workers fail when a peer node dies); later
//                       attempts print "ok rank=R world=W attempt=A restart_count=C", exit 0
//                       [finish_world=N]: later attempts with WORLD_SIZE < N print "waiting
//                       rank=R world=W attempt=A restart_count=C" and run until stopped (a
//                       job that goes on smaller until a replacement node joins)
//                       [slow_stop=S]: on SIGTERM in the first attempt, local ranks other
//                       than 0 stop watching their peers and exit 143 after S seconds (a rank
//                       writing its checkpoint); local rank 0 dies of it at once
//   fail-first-attempt-when file=PATH   on the first attempt: exit 1 once PATH exists (the
//                       test cuts a link, then makes the workers fail as gloo would); later
//                       attempts print "ok rank=R world=W attempt=A restart_count=C", exit 0
//   segv                die of SIGSEGV
//   hang                run forever without touching the heartbeat
//   beat [seconds=S]    touch the heartbeat file every 50 ms for S seconds (default 1), exit 0
//   ignore-sigterm      ignore SIGTERM and run forever
//   ignore-stop-signals ignore SIGTERM, SIGINT and SIGHUP and run forever
//   spawn-grandchild file=PATH [setsid=1]   fork a child that sleeps forever (in the worker's
//                       process group, or its own session with setsid=1), write its pid to
//                       PATH.<rank>, then run forever
//   print-env           print every contract variable as KEY=VALUE (unset ones as KEY=<unset>)
//   write-error-file [code=N] [message=TEXT]   write PyTorch's error.json, then exit N
//   sleep [seconds=S]   sleep S seconds (default: forever), exit 0
//   record-signals file=PATH   append "SIGNAME" lines to PATH.<rank> for each of SIGINT,
//                       SIGTERM, SIGHUP, SIGUSR1, SIGUSR2; exit 128+N on INT/TERM/HUP
//   store-members [delay=S]   after S seconds (default 0), through the job's store at
//                       MASTER_ADDR:MASTER_PORT as a worker connects (PyTorch's way, no
//                       declaration), count itself in ("members/arrived") and record its run
//                       ("members/<RANK>" = TORCHELASTIC_RUN_ID); once WORLD_SIZE ranks have
//                       recorded theirs, wait 1 s for stragglers, then print
//                       "members run=R world=W arrived=N runs=r0,r1,..." and exit 0. Workers of
//                       two jobs sharing keys show it as arrived > W or a foreign run.
//   rank-recovery dir=DIR fail=R [how=exit|stop] [announce=0]   the worker's side of rank-level
//                       recovery (launcher/agent/rank_replacement.h). With DLAUNCH_RECOVERY_KEY
//                       set (and not announce=0) it announces rank_recovery in its heartbeat
//                       file. Each start writes "pid=P replacement=0|1 key=K restart_count=C
//                       attempt=A world=W" to DIR/started.<rank>.<pid>. In attempt 0: rank R,
//                       once every rank's DIR/ready.<rank> exists and DIR/failed does not,
//                       creates it and
//                       exits 1 (how=exit) or stops itself with SIGSTOP (how=stop: silent, for
//                       --hang_timeout; [beat_first=S]: every rank beats every 50 ms for S
//                       seconds first, a pace for --hang_timeout auto); the others, when they announced, ignore SIGTERM, wait
//                       (beating) for the key K/1, write "count=N verdict=V" to DIR/seen.<rank>,
//                       then exit 0 on `replace` once DIR/replaced exists, 1 on `restart`, and
//                       on `shrink W R` wait for K/shrink_R/rank_<RANK>, append " rank=<it>" to
//                       that line and exit 0 ([fail_after_shrink=R2]: the one whose new rank is
//                       R2 exits 1, the others wait for the next verdict, write "count=N
//                       verdict=V" to DIR/seen_again.<rank> and, on `replace`, exit 0 once
//                       DIR/replaced exists); when they did not announce they wait until
//                       stopped. A replacement
//                       (DLAUNCH_REPLACEMENT=1) writes "count=N" (the counter it reads) to
//                       DIR/replaced and exits 0 ([replacement_exit=N]: N; [replacement_delay=S]:
//                       first sleeps S seconds, not beating); later attempts exit 0 at once.
//                       [then_fail=R2]: survivor R2 exits 1 as soon as it read `replace`.
// Options for every mode:
//   rank=R              only global rank R runs MODE; the others run `others`
//   others=MODE         what the other ranks do (default: sleep, i.e. until stopped)
//   ready=DIR           create DIR/ready.<rank> (with the pid) once set up
//   others_wait_for=PATH  the ranks running `others` first wait (up to 60 s) for PATH to exist
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/heartbeat.h"
#include "common/worker_env.h"
#include "rendezvous/tcp/tcp_store_client.h"

namespace {

std::map<std::string, std::string> g_opts;
int g_rank = 0;
int g_signal_fd = -1;
volatile sig_atomic_t g_stop_requested = 0;  // fail-when-peer-dies slow_stop=S

std::string opt(const std::string& key, const std::string& fallback) {
  auto it = g_opts.find(key);
  return it == g_opts.end() ? fallback : it->second;
}

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

void write_file(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "test_worker: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    std::exit(90);
  }
  std::fputs(text.c_str(), f);
  std::fclose(f);
}

void mark_ready() {
  std::string dir = opt("ready", "");
  if (dir.empty()) return;
  std::string tmp = dir + "/.ready." + std::to_string(g_rank);
  write_file(tmp, std::to_string(getpid()));
  std::rename(tmp.c_str(), (dir + "/ready." + std::to_string(g_rank)).c_str());
}

// Alive and not a zombie (a worker of a SIGKILLed agent may wait a moment to be reaped).
bool pid_alive(long pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return false;
  char buf[512] = {};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  const char* paren = std::strrchr(buf, ')');
  return n > 0 && paren && paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X';
}

[[noreturn]] void sleep_forever() {
  while (true) pause();
}

void on_signal(int sig) {
  // Async-signal-safe: write(2) only.
  const char* name = sig == SIGINT    ? "SIGINT\n"
                     : sig == SIGTERM ? "SIGTERM\n"
                     : sig == SIGHUP  ? "SIGHUP\n"
                     : sig == SIGUSR1 ? "SIGUSR1\n"
                                      : "SIGUSR2\n";
  if (g_signal_fd >= 0) (void)!write(g_signal_fd, name, std::strlen(name));
  if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) _exit(128 + sig);
}

// A later attempt (after the re-form) just says where it runs and succeeds.
int print_later_attempt() {
  std::printf("ok rank=%d world=%s attempt=%s restart_count=%s\n", g_rank,
              env_or("WORLD_SIZE", "?"), env_or("DLAUNCH_ATTEMPT", "?"),
              env_or("TORCHELASTIC_RESTART_COUNT", "?"));
  return 0;
}

// The job's store as a worker reaches it (MASTER_ADDR, MASTER_PORT), with generous timeouts.
dlaunch::TcpStoreClientOptions job_store_options() {
  using namespace std::chrono_literals;
  dlaunch::TcpStoreClientOptions o;
  o.host = env_or("MASTER_ADDR", "127.0.0.1");
  o.port = static_cast<uint16_t>(std::atoi(env_or("MASTER_PORT", "0")));
  o.connect_timeout = 30s;
  o.timeout = 60s;
  return o;
}

// store-members: what one job's workers see of each other in the store.
int store_members() {
  using namespace std::chrono_literals;
  std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(opt("delay", "0").c_str())));
  dlaunch::TcpStoreClient store(job_store_options());
  const std::string run = env_or("TORCHELASTIC_RUN_ID", "?");
  const int world = std::atoi(env_or("WORLD_SIZE", "1"));
  store.add("members/arrived", 1);
  store.set("members/" + std::to_string(g_rank), dlaunch::to_bytes(run));
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back("members/" + std::to_string(r));
  store.wait(keys, 60s);
  std::this_thread::sleep_for(1s);
  std::string runs;
  for (const auto& value : store.multi_get(keys)) {
    runs += (runs.empty() ? "" : ",") + dlaunch::to_string(value);
  }
  std::printf("members run=%s world=%d arrived=%lld runs=%s\n", run.c_str(), world,
              static_cast<long long>(store.add("members/arrived", 0)), runs.c_str());
  return 0;
}

// A worker's key left by attempt 0 (which then fails), looked for by attempt 1 through the
// same store, as a restarted PyTorch 2.x rank looks for its peers' addresses.
int store_leftover() {
  dlaunch::TcpStoreClient store(job_store_options());
  const std::string key = "leftover/" + std::to_string(g_rank);
  if (std::string(env_or("TORCHELASTIC_RESTART_COUNT", "0")) == "0") {
    store.set(key, dlaunch::to_bytes("attempt 0"));
    return 3;
  }
  std::printf("leftover rank=%d seen=%s\n", g_rank, store.check({key}) ? "yes" : "no");
  return 0;
}

bool file_exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

int rank_recovery() {
  using namespace std::chrono_literals;
  const std::string dir = opt("dir", ".");
  const std::string key = env_or("DLAUNCH_RECOVERY_KEY", "");
  const bool replacement = std::string(env_or("DLAUNCH_REPLACEMENT", "")) == "1";
  const std::string attempt = env_or("DLAUNCH_ATTEMPT", "?");
  const std::string beat_file = env_or("DLAUNCH_HEARTBEAT_FILE", "");
  const bool announced = !key.empty() && opt("announce", "1") != "0";
  if (replacement) {
    // A replacement that takes its time to start: it has not beaten (nor announced) yet.
    std::this_thread::sleep_for(
        std::chrono::duration<double>(std::atof(opt("replacement_delay", "0").c_str())));
  }
  if (announced && !beat_file.empty()) {
    FILE* f = std::fopen(beat_file.c_str(), "a");
    if (f) {
      std::fputs("rank_recovery\n", f);
      std::fclose(f);
    }
  }
  write_file(dir + "/started." + std::to_string(g_rank) + "." + std::to_string(getpid()),
             "pid=" + std::to_string(getpid()) + " replacement=" + (replacement ? "1" : "0") +
                 " key=" + (key.empty() ? "<unset>" : key) +
                 " restart_count=" + env_or("TORCHELASTIC_RESTART_COUNT", "?") +
                 " attempt=" + attempt + " world=" + env_or("WORLD_SIZE", "?") + "\n");
  if (replacement) {
    dlaunch::TcpStoreClient store(job_store_options());
    write_file(dir + "/replaced", "count=" + std::to_string(store.add(key, 0)) + "\n");
    return std::atoi(opt("replacement_exit", "0").c_str());
  }
  if (attempt != "0") return 0;
  if (announced) ::signal(SIGTERM, SIG_IGN);  // the verdict is read before the stop
  // A pace for --hang_timeout auto to learn before the failure.
  const auto beat_until = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(std::atof(opt("beat_first", "0").c_str()));
  while (std::chrono::steady_clock::now() < beat_until) {
    dlaunch::heartbeat();
    std::this_thread::sleep_for(50ms);
  }
  g_opts["ready"] = dir;
  mark_ready();
  const int world = std::atoi(env_or("WORLD_SIZE", "1"));
  if (g_rank == std::atoi(opt("fail", "-1").c_str())) {
    for (int r = 0; r < world; ++r) {
      while (!file_exists(dir + "/ready." + std::to_string(r))) std::this_thread::sleep_for(10ms);
    }
    if (file_exists(dir + "/failed")) return 0;
    write_file(dir + "/failed", std::to_string(getpid()));
    if (opt("how", "exit") == "stop") ::raise(SIGSTOP);
    return 1;
  }
  if (!announced) sleep_forever();
  dlaunch::TcpStoreClient store(job_store_options());
  // Waits (beating) for generation g's verdict; "" after 120 s.
  auto verdict_of = [&](int64_t g) -> std::string {
    const std::string next = key + "/" + std::to_string(g);
    for (auto give_up = std::chrono::steady_clock::now() + 120s;;) {
      dlaunch::heartbeat();
      try {
        store.wait({next}, 200ms);
        return dlaunch::to_string(store.get(next));
      } catch (const dlaunch::TimeoutError&) {
        if (std::chrono::steady_clock::now() > give_up) return "";
      }
    }
  };
  const std::string verdict = verdict_of(1);
  if (verdict.empty()) {
    write_file(dir + "/seen." + std::to_string(g_rank), "timeout\n");
    return 2;
  }
  const std::string seen = "count=" + std::to_string(store.add(key, 0)) + " verdict=" + verdict;
  if (verdict.rfind("shrink ", 0) == 0) {
    // "shrink <world> <round>": this rank's new rank is at K/shrink_<round>/rank_<RANK>.
    const std::string round = verdict.substr(verdict.rfind(' ') + 1);
    const std::string mine = key + "/shrink_" + round + "/rank_" + std::to_string(g_rank);
    store.wait({mine}, 120s);
    const std::string new_rank = dlaunch::to_string(store.get(mine));
    write_file(dir + "/seen." + std::to_string(g_rank), seen + " rank=" + new_rank + "\n");
    const std::string fail_after = opt("fail_after_shrink", "");
    if (fail_after.empty()) return 0;
    if (new_rank == fail_after) return 1;
    // The others wait for the failed rank's replacement, as survivors do: the generation after
    // the shrink's (1), whatever the counter says by now.
    const std::string again = verdict_of(2);
    write_file(dir + "/seen_again." + std::to_string(g_rank),
               "count=" + std::to_string(store.add(key, 0)) + " verdict=" + again + "\n");
    if (again != "replace") return 1;
    while (!file_exists(dir + "/replaced")) {
      dlaunch::heartbeat();
      std::this_thread::sleep_for(50ms);
    }
    return 0;
  }
  write_file(dir + "/seen." + std::to_string(g_rank), seen + "\n");
  if (verdict != "replace") return 1;
  if (std::to_string(g_rank) == opt("then_fail", "")) return 1;
  while (!file_exists(dir + "/replaced")) {
    dlaunch::heartbeat();
    std::this_thread::sleep_for(50ms);
  }
  return 0;
}

int run_mode(const std::string& mode) {
  if (mode == "rank-recovery") return rank_recovery();
  if (mode == "store-members") return store_members();
  if (mode == "store-leftover") return store_leftover();
  if (mode == "ok") {
    mark_ready();
    std::printf("ok rank=%d\n", g_rank);
    return 0;
  }
  if (mode == "crash") {
    mark_ready();
    std::fprintf(stderr, "test_worker rank %d: crashing on purpose\n", g_rank);
    return std::atoi(opt("code", "3").c_str());
  }
  if (mode == "crash-once") {
    mark_ready();
    if (std::string(env_or("TORCHELASTIC_RESTART_COUNT", "0")) == "0") {
      std::fprintf(stderr, "test_worker rank %d: crashing once (restart count 0)\n", g_rank);
      return std::atoi(opt("code", "3").c_str());
    }
    std::printf("ok rank=%d restart_count=%s\n", g_rank, env_or("TORCHELASTIC_RESTART_COUNT", ""));
    return 0;
  }
  if (mode == "wait-once") {
    mark_ready();
    if (std::string(env_or("TORCHELASTIC_RESTART_COUNT", "0")) == "0") sleep_forever();
    std::printf("ok rank=%d restart_count=%s\n", g_rank, env_or("TORCHELASTIC_RESTART_COUNT", ""));
    return 0;
  }
  if (mode == "wait-first-attempt") {
    mark_ready();
    if (std::string(env_or("DLAUNCH_ATTEMPT", "0")) == "0") sleep_forever();
    std::printf("ok rank=%d world=%s attempt=%s\n", g_rank, env_or("WORLD_SIZE", "?"),
                env_or("DLAUNCH_ATTEMPT", "?"));
    return 0;
  }
  if (mode == "fail-when-peer-dies") {
    mark_ready();
    if (std::string(env_or("DLAUNCH_ATTEMPT", "0")) != "0") {
      if (std::atoi(env_or("WORLD_SIZE", "0")) >= std::atoi(opt("finish_world", "0").c_str())) {
        return print_later_attempt();
      }
      std::printf("waiting rank=%d world=%s attempt=%s restart_count=%s\n", g_rank,
                  env_or("WORLD_SIZE", "?"), env_or("DLAUNCH_ATTEMPT", "?"),
                  env_or("TORCHELASTIC_RESTART_COUNT", "?"));
      std::fflush(stdout);
      sleep_forever();
    }
    const double slow_stop = std::atof(opt("slow_stop", "0").c_str());
    if (slow_stop > 0 && std::atoi(env_or("LOCAL_RANK", "0")) != 0) {
      signal(SIGTERM, [](int) { g_stop_requested = 1; });
    }
    const std::string dir = opt("ready", ".");
    const int world = std::atoi(env_or("WORLD_SIZE", "1"));
    std::map<int, long> peers;
    for (int i = 0; i < 6000 && static_cast<int>(peers.size()) < world; ++i) {
      for (int r = 0; r < world; ++r) {
        if (peers.count(r)) continue;
        FILE* f = std::fopen((dir + "/ready." + std::to_string(r)).c_str(), "r");
        long pid = 0;
        if (f && std::fscanf(f, "%ld", &pid) == 1) peers[r] = pid;
        if (f) std::fclose(f);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    while (true) {
      if (g_stop_requested) {
        std::this_thread::sleep_for(std::chrono::duration<double>(slow_stop));
        return 128 + SIGTERM;
      }
      for (const auto& [r, pid] : peers) {
        if (!pid_alive(pid)) {
          std::fprintf(stderr, "test_worker rank %d: peer rank %d (pid %ld) is gone: "
                       "Connection reset by peer\n", g_rank, r, pid);
          return 1;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (mode == "fail-first-attempt-when") {
    mark_ready();
    if (std::string(env_or("DLAUNCH_ATTEMPT", "0")) != "0") return print_later_attempt();
    const std::string path = opt("file", "fail");
    while (access(path.c_str(), F_OK) != 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::fprintf(stderr, "test_worker rank %d: a peer stopped answering: Connection timed out\n",
                 g_rank);
    return 1;
  }
  if (mode == "segv") {
    mark_ready();
    std::fflush(stdout);
    signal(SIGSEGV, SIG_DFL);
    raise(SIGSEGV);
    return 99;
  }
  if (mode == "hang") {
    mark_ready();
    sleep_forever();
  }
  if (mode == "beat") {
    mark_ready();
    double seconds = std::atof(opt("seconds", "1").c_str());
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      dlaunch::heartbeat();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::printf("beat done rank=%d\n", g_rank);
    return 0;
  }
  if (mode == "ignore-sigterm") {
    signal(SIGTERM, SIG_IGN);
    mark_ready();
    sleep_forever();
  }
  if (mode == "ignore-stop-signals") {
    for (int s : {SIGTERM, SIGINT, SIGHUP}) signal(s, SIG_IGN);
    mark_ready();
    sleep_forever();
  }
  if (mode == "spawn-grandchild") {
    // The worker reports ready only once the grandchild has left its group: a peer that fails
    // on "ready" could otherwise have the group killed while the grandchild is still in it
    // (then killpg, not the orphan sweep, ends it, and DlaunchOrphans.SetsidGrandchildIs...
    // missed the sweep's line: it failed so once in the fifth session).
    int settled[2];
    if (pipe(settled) != 0) return 98;
    pid_t child = fork();
    if (child == 0) {
      // setsid=1: leave the worker's process group and session, as a daemon would.
      if (opt("setsid", "0") == "1") setsid();
      const char one = 1;
      if (write(settled[1], &one, 1) != 1) _exit(97);
      close(settled[0]);
      close(settled[1]);
      sleep_forever();
    }
    close(settled[1]);
    char byte = 0;
    while (read(settled[0], &byte, 1) < 0 && errno == EINTR) {
    }
    close(settled[0]);
    write_file(opt("file", "grandchild") + "." + std::to_string(g_rank), std::to_string(child));
    mark_ready();
    sleep_forever();
  }
  if (mode == "print-env") {
    namespace n = dlaunch::env_names;
    for (const char* name :
         {n::kRank, n::kLocalRank, n::kWorldSize, n::kLocalWorldSize, n::kGroupRank,
          n::kGroupWorldSize, n::kRoleRank, n::kRoleWorldSize, n::kRoleName, n::kMasterAddr,
          n::kMasterPort, n::kRestartCount, n::kMaxRestarts, n::kRunId, n::kUseAgentStore,
          n::kErrorFile, n::kOmpNumThreads, n::kNcclAsyncErrorHandling,
          n::kTorchNcclAsyncErrorHandling, n::kHeartbeatFile,
          n::kNodeId, n::kAttempt, n::kFlashDir, n::kShutdownGrace}) {
      std::printf("%s=%s\n", name, env_or(name, "<unset>"));
    }
    return 0;
  }
  if (mode == "write-error-file") {
    const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
    std::string message = opt("message", "ValueError: the test worker failed on purpose");
    if (path) {
      // PyTorch's format (torch/distributed/elastic/multiprocessing/errors/error_handler.py).
      std::string json = "{\"message\": {\"message\": \"" + message +
                         "\", \"extraInfo\": {\"py_callstack\": \"Traceback (most recent call "
                         "last):\\n  File \\\"train.py\\\", line 7, in <module>\\n" + message +
                         "\\n\", \"timestamp\": \"" + std::to_string(std::time(nullptr)) +
                         "\"}}}";
      write_file(path, json);
    }
    std::fprintf(stderr, "this stderr line must not be the reported cause\n");
    return std::atoi(opt("code", "1").c_str());
  }
  if (mode == "sleep") {
    mark_ready();
    std::string s = opt("seconds", "");
    if (s.empty()) sleep_forever();
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(s.c_str())));
    return 0;
  }
  if (mode == "record-signals") {
    std::string path = opt("file", "signals") + "." + std::to_string(g_rank);
    g_signal_fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    // Every recorded signal is blocked while one is being recorded, so a SIGTERM that arrives
    // during the SIGUSR2 handler cannot exit before SIGUSR2's line is written.
    struct sigaction action {};
    action.sa_handler = on_signal;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&action.sa_mask, s);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) sigaction(s, &action, nullptr);
    mark_ready();
    sleep_forever();
  }
  std::fprintf(stderr, "test_worker: unknown mode '%s'\n", mode.c_str());
  return 64;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: dlaunch_test_worker MODE [key=value...]\n");
    return 64;
  }
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    size_t eq = a.find('=');
    if (eq != std::string::npos) g_opts[a.substr(0, eq)] = a.substr(eq + 1);
  }
  g_rank = std::atoi(env_or("RANK", "0"));
  std::string mode = argv[1];
  std::string only = opt("rank", "");
  if (!only.empty() && std::atoi(only.c_str()) != g_rank) {
    mode = opt("others", "sleep");
    std::string wait_for = opt("others_wait_for", "");
    for (int i = 0; !wait_for.empty() && i < 6000 && access(wait_for.c_str(), F_OK) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  int code = run_mode(mode);
  std::fflush(stdout);
  return code;
}
