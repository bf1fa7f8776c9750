#include "bench/rendezvous/socket_bytes.h"

#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>

namespace dlaunch::sim {

SocketBytes tcp_bytes_of_this_process() {
  SocketBytes total;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return total;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) continue;  // not a TCP socket
    if (info.tcpi_state != 1 /* TCP_ESTABLISHED */) continue;  // the listener
    total.received += static_cast<int64_t>(info.tcpi_bytes_received);
    total.sent += static_cast<int64_t>(info.tcpi_bytes_sent);
    ++total.sockets;
  }
  closedir(dir);
  return total;
}

}  // namespace dlaunch::sim
