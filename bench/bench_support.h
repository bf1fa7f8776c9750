// Small helpers the benchmark programs share (benchmarks do not link tests/support): a
// monotonic clock in ns, CPU time from getrusage, loopback sockets, and the PyTorch peers.
#pragma once

#include "tests/support/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace dlaunch::bench {

// CLOCK_MONOTONIC in ns: system-wide, so it compares with the stamps other processes print.
inline int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// CPU time (user + system) in seconds of the calling thread (RUSAGE_THREAD) or the process.
inline double cpu_seconds(int who) {
  rusage ru{};
  getrusage(who, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// "2,8,32" -> {2, 8, 32}: the --agents style lists of the benchmarks.
inline std::vector<int> parse_int_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoi(item));
  return out;
}

using dlaunch::testing::free_port;  // one definition for tests and benchmarks

// A blocking TCP connection to 127.0.0.1:port with TCP_NODELAY, or -1 when connect fails.
inline int dial_loopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// A PyTorch the benchmarks put beside dlaunch: its interpreter and the version it reports.
struct TorchPeer {
  std::string python;
  std::string version;  // torch.__version__ without a local part ("2.15.0"), "" when absent
  bool is_2x() const { return !version.empty() && version[0] != '1'; }
};

// torch.__version__ of `python` without its local part ("2.15.0" of "2.15.0+cu132"), or "" when
// that interpreter has no torch.
inline std::string torch_version_of(const std::string& python) {
  std::string cmd = "'" + python + "' -c 'import torch; print(torch.__version__)' 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  char buf[128] = {};
  std::string out = fgets(buf, sizeof(buf), p) ? buf : "";
  pclose(p);
  out = out.substr(0, out.find_first_of("+\n"));
  return out;
}

// Debian's PyTorch 1.13 and the pinned 2.x of scripts/setup_torch2.sh (the tests' place, or
// $DLAUNCH_TORCH2_PYTHON), each only when its interpreter imports torch: the peers' figures
// then come from the same run as ours.
inline std::vector<TorchPeer> torch_peers() {
  const char* env = std::getenv("DLAUNCH_TORCH2_PYTHON");
  std::vector<TorchPeer> peers;
  for (std::string python : {std::string("/usr/bin/python3"),
                             std::string(env && *env ? env : DLAUNCH_TORCH2_PYTHON)}) {
    std::string version = torch_version_of(python);
    if (version.empty()) {
      std::printf("peer: %s has no torch; its column is left out\n", python.c_str());
      continue;
    }
    peers.push_back({python, version});
  }
  return peers;
}

}  // namespace dlaunch::bench
