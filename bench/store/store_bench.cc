// Store operations per second on loopback: dlaunch's TcpStoreServer against PyTorch's own
// TCPStore servers (Debian's 1.13; the 2.x of scripts/setup_torch2.sh, libuv and classic), driven
// by the same client in each peer's dialect (one blocking connection per client thread, SET + GET
// + ADD per iteration, GET and ADD wait for their replies).
// Also holds N idle connections open (from a child process, which has its own fd table) while
// measuring, to show the server carries 10,000 clients. With --depth 1 it also runs the loop
// through dlaunch's own TcpStoreClient (2.x dialect) against our server. Each figure comes with
// the CPU time per operation of the server and of the clients (getrusage; /proc for PyTorch's
// server process), which shows where the time goes independently of other load.
//
//   store_bench [--clients 16] [--seconds 3] [--depth 1] [--hold 10000] [--no-peer]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/byte_order.h"
#include "bench/bench_support.h"
#include "rendezvous/tcp/tcp_store_client.h"
#include "rendezvous/tcp/tcp_store_server.h"

using namespace dlaunch;

namespace {

using dlaunch::bench::cpu_seconds;
using dlaunch::bench::dial_loopback;

bool send_all(int fd, const std::vector<uint8_t>& b) {
  size_t off = 0;
  while (off < b.size()) {
    ssize_t n = ::send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += n;
  }
  return true;
}
bool recv_all(int fd, void* dst, size_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r <= 0) return false;
    got += r;
  }
  return true;
}
void put_u64(std::vector<uint8_t>& b, uint64_t v) {
  size_t at = b.size();
  b.resize(at + 8);
  store_le<uint64_t>(b.data() + at, v);
}
void put_str(std::vector<uint8_t>& b, const std::string& s) {
  put_u64(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}

// CPU time of another process (utime + stime from /proc/<pid>/stat), in seconds.
double process_cpu_seconds(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return 0;
  char buf[1024] = {};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces
  if (!p) return 0;
  unsigned long utime = 0, stime = 0;
  // Fields after ") ": state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt
  // cmajflt utime(14) stime(15).
  if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime,
                  &stime) != 2) {
    return 0;
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

struct ClientResult {
  uint64_t ops = 0;
  double cpu = 0;  // this client thread's CPU seconds
};

// The wire dialect of the raw client: PyTorch 1.13's, or 2.x's (which opens with VALIDATE and
// numbers its opcodes one higher; the replies are the same). docs/store_protocol.md has both.
enum class Dialect { kTorch113, kTorch2 };

const char* dialect_name(Dialect d) { return d == Dialect::kTorch113 ? "1.13" : "2.x"; }

// One client: SET k v; GET k; ADD c 1, `depth` iterations sent before the replies are read
// (1: plain request/response). Returns ops done.
uint64_t client_loop(uint16_t port, int id, int depth, Dialect dialect,
                     const std::atomic<bool>& stop) {
  int fd = dial_loopback(port);
  if (fd < 0) return 0;
  uint8_t shift = dialect == Dialect::kTorch2 ? 1 : 0;
  if (dialect == Dialect::kTorch2 && !send_all(fd, {0x00, 0xCE, 0xF7, 0x85, 0x3C})) {
    ::close(fd);
    return 0;
  }
  std::string key = "/bench/k" + std::to_string(id);
  std::vector<uint8_t> set, get, add;
  set.push_back(0 + shift);
  put_str(set, key);
  put_str(set, std::string(64, 'v'));
  get.push_back(2 + shift);
  put_str(get, key);
  add.push_back(3 + shift);
  put_str(add, "/bench/counter");
  put_u64(add, 1);
  uint64_t ops = 0;
  std::vector<uint8_t> buf(depth * (8 + 64 + 8));
  std::vector<uint8_t> batch;
  for (int i = 0; i < depth; ++i) {
    batch.insert(batch.end(), set.begin(), set.end());
    batch.insert(batch.end(), get.begin(), get.end());
    batch.insert(batch.end(), add.begin(), add.end());
  }
  while (!stop.load(std::memory_order_relaxed)) {
    if (depth == 1) {
      if (!send_all(fd, set) || !send_all(fd, get) || !recv_all(fd, buf.data(), 8 + 64)) break;
      if (!send_all(fd, add) || !recv_all(fd, buf.data(), 8)) break;
    } else {
      if (!send_all(fd, batch) || !recv_all(fd, buf.data(), buf.size())) break;
    }
    ops += 3 * depth;
  }
  ::close(fd);
  return ops;
}

struct Measurement {
  double ops_per_s = 0;
  double client_us_per_op = 0;  // CPU of the client threads per operation
  double server_us_per_op = 0;  // CPU of the server (thread or process) per operation
};

// The same loop through dlaunch's own TcpStoreClient (2.x dialect, what agents and dtrain use):
// set, get, add per iteration. As an agent's connection: its get is one request (a worker's
// WAITs first, a round trip more, as it may face PyTorch's own server).
uint64_t dlaunch_client_loop(uint16_t port, int id, const std::atomic<bool>& stop) {
  TcpStoreClientOptions o;
  o.port = port;
  o.agent = true;
  TcpStoreClient client(o);
  std::string key = "/bench/c" + std::to_string(id);
  Bytes value(64, 'v');
  uint64_t ops = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    client.set(key, value);
    if (client.get(key).size() != value.size()) break;
    client.add("/bench/counter", 1);
    ops += 3;
  }
  return ops;
}

// Runs the clients against `port` for `seconds`. The server's CPU is that of `server_pid`, or
// when it is 0 (our server, a thread of this process), this process's CPU less the clients'.
Measurement measure(uint16_t port, int clients, int depth, double seconds, pid_t server_pid,
                    Dialect dialect, bool dlaunch_client = false) {
  std::atomic<bool> stop{false};
  std::vector<ClientResult> results(clients);
  std::vector<std::thread> threads;
  double server_cpu0 = server_pid ? process_cpu_seconds(server_pid) : cpu_seconds(RUSAGE_SELF);
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      double cpu0 = cpu_seconds(RUSAGE_THREAD);
      results[i].ops = dlaunch_client ? dlaunch_client_loop(port, i, stop)
                                      : client_loop(port, i, depth, dialect, stop);
      results[i].cpu = cpu_seconds(RUSAGE_THREAD) - cpu0;
    });
  }
  auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double server_cpu =
      (server_pid ? process_cpu_seconds(server_pid) : cpu_seconds(RUSAGE_SELF)) - server_cpu0;
  uint64_t total = 0;
  double client_cpu = 0;
  for (const auto& r : results) {
    total += r.ops;
    client_cpu += r.cpu;
  }
  if (!server_pid) server_cpu -= client_cpu;
  Measurement m;
  m.ops_per_s = total / elapsed;
  if (total > 0) {
    m.client_us_per_op = 1e6 * client_cpu / total;
    m.server_us_per_op = 1e6 * server_cpu / total;
  }
  return m;
}

// A child that opens `n` connections, proves each with an ADD, reports on `report_fd`, and
// holds them until killed.
pid_t hold_connections(uint16_t port, int n, int report_fd) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  std::vector<int> fds;
  std::vector<uint8_t> add;
  add.push_back(3);
  put_str(add, "/bench/held");
  put_u64(add, 1);
  int ok = 0;
  for (int i = 0; i < n; ++i) {
    int fd = dial_loopback(port);
    if (fd < 0) break;
    fds.push_back(fd);
    uint8_t r[8];
    if (send_all(fd, add) && recv_all(fd, r, 8)) ++ok;
  }
  (void)!write(report_fd, &ok, sizeof(ok));
  pause();
  _exit(0);
}

// Runs our TcpStoreServer in a child process, as PyTorch's runs in its own: the clients then
// meet both servers across a process boundary, and the server's CPU is read from /proc.
// Returns its pid and port; the child lives until killed.
pid_t start_own_server(uint16_t* port) {
  int p[2];
  if (pipe(p) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    ::close(p[0]);
    TcpStoreServer server(TcpStoreServerOptions{});
    uint16_t bound = server.start();
    (void)!write(p[1], &bound, sizeof(bound));
    ::close(p[1]);
    pause();
    _exit(0);
  }
  ::close(p[1]);
  ssize_t n = read(p[0], port, sizeof(*port));
  ::close(p[0]);
  if (n != sizeof(*port)) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

// Starts a PyTorch TCPStore server in `python` (2.x: the libuv one, or the classic one with
// use_libuv=False); returns its pid and port. The pipe stays open (in *out_fd) until the server
// is killed, so its stdout never breaks.
pid_t start_torch_server(const std::string& python, const std::string& extra_args, uint16_t* port,
                         int* out_fd) {
  int p[2];
  if (pipe(p) != 0) return -1;
  std::string code =
      "import datetime, time, torch.distributed as d\n"
      "s = d.TCPStore('127.0.0.1', 0, None, True, datetime.timedelta(seconds=600), False" +
      extra_args +
      ")\n"
      "print(s.port, flush=True)\n"
      "time.sleep(1e6)\n";
  pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], 1);
    ::close(p[0]);
    execl(python.c_str(), python.c_str(), "-c", code.c_str(), (char*)nullptr);
    _exit(127);
  }
  ::close(p[1]);
  char buf[32] = {};
  ssize_t n = read(p[0], buf, sizeof(buf) - 1);
  *out_fd = p[0];
  if (n <= 0) {
    ::close(p[0]);
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  *port = static_cast<uint16_t>(std::stoi(buf));
  return pid;
}

void print_measurement(const std::string& who, int clients, int depth, Dialect dialect,
                       const Measurement& m) {
  std::printf("%s: %d clients x depth %d (%s dialect), %.0f ops/s\n", who.c_str(), clients, depth,
              dialect_name(dialect), m.ops_per_s);
  std::printf("  CPU per op: server %.2f us, clients %.2f us\n", m.server_us_per_op,
              m.client_us_per_op);
}

}  // namespace

int main(int argc, char** argv) {
  int clients = 16, hold = 0, depth = 1;
  double seconds = 3;
  bool peer = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--clients" && i + 1 < argc) clients = std::stoi(argv[++i]);
    else if (a == "--seconds" && i + 1 < argc) seconds = std::stod(argv[++i]);
    else if (a == "--hold" && i + 1 < argc) hold = std::stoi(argv[++i]);
    else if (a == "--depth" && i + 1 < argc) depth = std::stoi(argv[++i]);
    else if (a == "--no-peer") peer = false;
    else {
      std::fprintf(stderr, "usage: store_bench [--clients N] [--seconds S] [--depth D] [--hold N] [--no-peer]\n");
      return 2;
    }
  }
  // With --hold the server runs in this process, so that it can report its connection count;
  // otherwise in a child, like PyTorch's (see start_own_server).
  std::unique_ptr<TcpStoreServer> local;
  pid_t server_pid = 0;
  uint16_t port = 0;
  if (hold > 0) {
    local = std::make_unique<TcpStoreServer>(TcpStoreServerOptions{});
    port = local->start();
  } else {
    server_pid = start_own_server(&port);
    if (server_pid < 0) {
      std::fprintf(stderr, "store_bench: could not start the dlaunch server process\n");
      return 1;
    }
  }
  pid_t holder = -1;
  if (hold > 0) {
    int p[2];
    if (pipe(p) != 0) return 1;
    auto t0 = std::chrono::steady_clock::now();
    holder = hold_connections(port, hold, p[1]);
    int ok = 0;
    if (read(p[0], &ok, sizeof(ok)) != sizeof(ok)) ok = -1;
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("held connections: %d of %d answered (server reports %zu open), opened in %.2f s\n",
                ok, hold, local->num_connections(), dt);
  }
  // Ours in both dialects, so that each peer is compared with the dialect its clients speak.
  Measurement ours[2];
  for (Dialect d : {Dialect::kTorch113, Dialect::kTorch2}) {
    ours[static_cast<int>(d)] = measure(port, clients, depth, seconds, server_pid, d);
    print_measurement(std::string("dlaunch TcpStoreServer") +
                          (hold > 0 ? " (while holding the idle connections)" : ""),
                      clients, depth, d, ours[static_cast<int>(d)]);
  }
  if (holder > 0) {
    kill(holder, SIGKILL);
    waitpid(holder, nullptr, 0);
  }
  if (depth == 1) {
    Measurement own =
        measure(port, clients, 1, seconds, server_pid, Dialect::kTorch2, /*dlaunch_client=*/true);
    print_measurement("dlaunch TcpStoreClient -> dlaunch TcpStoreServer", clients, 1,
                      Dialect::kTorch2, own);
  }
  if (server_pid > 0) {
    kill(server_pid, SIGKILL);
    waitpid(server_pid, nullptr, 0);
  }
  if (!peer) return 0;
  for (const auto& torch : dlaunch::bench::torch_peers()) {
    Dialect d = torch.is_2x() ? Dialect::kTorch2 : Dialect::kTorch113;
    std::vector<std::pair<std::string, std::string>> servers = {{"", ""}};
    if (torch.is_2x()) servers = {{" (libuv)", ", use_libuv=True"}, {" (classic)", ", use_libuv=False"}};
    for (const auto& [label, args] : servers) {
      std::string who = "PyTorch " + torch.version + " TCPStore server" + label;
      uint16_t torch_port = 0;
      int torch_fd = -1;
      pid_t pid = start_torch_server(torch.python, args, &torch_port, &torch_fd);
      if (pid < 0) {
        std::printf("%s: not measured (%s could not start it)\n", who.c_str(),
                    torch.python.c_str());
        continue;
      }
      Measurement theirs = measure(torch_port, clients, depth, seconds, pid, d);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      ::close(torch_fd);
      print_measurement(who, clients, depth, d, theirs);
      const Measurement& mine = ours[static_cast<int>(d)];
      std::printf("ratio dlaunch / %s: %.2fx ops/s (server CPU per op: %.2fx less)\n",
                  who.c_str(), theirs.ops_per_s > 0 ? mine.ops_per_s / theirs.ops_per_s : 0.0,
                  mine.server_us_per_op > 0 ? theirs.server_us_per_op / mine.server_us_per_op
                                             : 0.0);
    }
  }
  return 0;
}
