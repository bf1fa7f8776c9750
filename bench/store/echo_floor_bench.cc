// The floor under store_bench: the fastest request/response loop this machine's loopback TCP
// allows with the same shape of load, i.e. N blocking client threads (one send + one recv per
// round trip, the least a blocking client can do) against one server thread running a minimal
// level-triggered epoll loop (read what is there, answer every complete request in one write).
// No store, no parsing, no allocation: what is left is the kernel's cost per round trip (TCP on
// loopback, wake-ups, context switches). store_bench's request/response figure cannot beat
// this; its loop does 3 operations per 2 round trips (SET needs no reply), so the ceiling for
// it is 1.5 x the round trips per second printed here.
//
//   echo_floor_bench [--clients 16] [--seconds 3] [--request 64] [--reply 64]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_support.h"

namespace {

using dlaunch::bench::cpu_seconds;

int dial_or_exit(uint16_t port) {
  int fd = dlaunch::bench::dial_loopback(port);
  if (fd < 0) {
    std::perror("connect");
    std::exit(1);
  }
  return fd;
}

int listen_loopback(uint16_t* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(fd, 512) != 0) {
    std::perror("bind/listen");
    std::exit(1);
  }
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  *port = ntohs(sa.sin_port);
  return fd;
}

// The server: accepts `clients` connections, then answers each complete `request`-byte message
// with `reply` bytes until the clients hang up. Returns its CPU seconds while serving.
double serve(int listener, int clients, size_t request, size_t reply) {
  int ep = epoll_create1(EPOLL_CLOEXEC);
  std::vector<size_t> partial(65536, 0);  // bytes of an incomplete request, by fd
  std::vector<char> out(64 * 1024 * 16, 'r'), in(64 * 1024);
  for (int i = 0; i < clients; ++i) {
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  }
  int open = clients;
  double cpu0 = cpu_seconds(RUSAGE_THREAD);
  epoll_event events[64];
  while (open > 0) {
    int n = epoll_wait(ep, events, 64, -1);
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      ssize_t r = ::read(fd, in.data(), in.size());
      if (r <= 0) {
        ::close(fd);
        --open;
        continue;
      }
      size_t have = partial[fd] + static_cast<size_t>(r);
      size_t complete = have / request;
      partial[fd] = have % request;
      if (complete > 0) (void)!::write(fd, out.data(), complete * reply);
    }
  }
  double cpu = cpu_seconds(RUSAGE_THREAD) - cpu0;
  ::close(ep);
  return cpu;
}

}  // namespace

int main(int argc, char** argv) {
  int clients = 16;
  double seconds = 3;
  size_t request = 64, reply = 64;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--clients" && i + 1 < argc) clients = std::stoi(argv[++i]);
    else if (a == "--seconds" && i + 1 < argc) seconds = std::stod(argv[++i]);
    else if (a == "--request" && i + 1 < argc) request = std::stoul(argv[++i]);
    else if (a == "--reply" && i + 1 < argc) reply = std::stoul(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: echo_floor_bench [--clients N] [--seconds S] [--request B] [--reply B]\n");
      return 2;
    }
  }
  uint16_t port = 0;
  int listener = listen_loopback(&port);
  double server_cpu = 0;
  std::thread server([&] { server_cpu = serve(listener, clients, request, reply); });
  std::vector<int> fds;
  for (int i = 0; i < clients; ++i) fds.push_back(dial_or_exit(port));

  std::atomic<bool> stop{false};
  std::vector<uint64_t> trips(clients, 0);
  std::vector<double> client_cpu(clients, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      std::vector<char> req(request, 'q'), rep(reply);
      double cpu0 = cpu_seconds(RUSAGE_THREAD);
      uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        if (::send(fds[i], req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request)) break;
        size_t got = 0;
        while (got < reply) {
          ssize_t r = ::recv(fds[i], rep.data() + got, reply - got, 0);
          if (r <= 0) break;
          got += static_cast<size_t>(r);
        }
        if (got < reply) break;
        ++n;
      }
      trips[i] = n;
      client_cpu[i] = cpu_seconds(RUSAGE_THREAD) - cpu0;
    });
  }
  auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int fd : fds) ::close(fd);
  server.join();
  ::close(listener);
  uint64_t total = 0;
  double clients_cpu = 0;
  for (int i = 0; i < clients; ++i) {
    total += trips[i];
    clients_cpu += client_cpu[i];
  }
  double rate = total / elapsed;
  // The server's CPU includes the few ms of accepting and of draining the hang-ups: noise.
  double server_us = total ? 1e6 * server_cpu / total : 0;
  double clients_us = total ? 1e6 * clients_cpu / total : 0;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  double bound = server_us + clients_us > 0 ? cores * 1e6 / (server_us + clients_us) : 0;
  std::printf("echo floor: %d blocking clients, 1 send + 1 recv per round trip, %zu B request, "
              "%zu B reply: %.0f round trips/s\n",
              clients, request, reply, rate);
  std::printf("  CPU per round trip: server %.2f us, clients %.2f us, total %.2f us: with all "
              "%ld cores busy at most %.0f round trips/s\n",
              server_us, clients_us, server_us + clients_us, cores, bound);
  std::printf("ceiling for store_bench's loop (SET+GET, ADD: 3 ops per 2 round trips): %.0f ops/s "
              "measured, %.0f ops/s with all cores busy\n",
              1.5 * rate, 1.5 * bound);
  return 0;
}
