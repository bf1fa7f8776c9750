// The bytes a process's TCP sockets carried, from the kernel's own per-socket counters
// (TCP_INFO): what rdzv_sim's store host moved, measured where it is served, the same way with
// and without the store proxy. Socket I/O does not show in /proc/<pid>/io.
#pragma once

#include <cstdint>

namespace dlaunch::sim {

struct SocketBytes {
  int64_t received = 0;  // payload bytes received (tcpi_bytes_received)
  // payload bytes sent (tcpi_bytes_sent, retransmits too, none on loopback); not the acked
  // count, which lags a delayed ACK behind the last replies of a phase
  int64_t sent = 0;
  int64_t sockets = 0;   // connected TCP sockets counted
};

// Sums over this process's open TCP sockets: a closed socket's bytes are no longer counted,
// so take differences only over a phase in which no connection closes.
SocketBytes tcp_bytes_of_this_process();

}  // namespace dlaunch::sim
