// A check of fiber_wait_hooks.cc: a store client's connect backoff on one fiber must not hold
// the other fibers of its process. Fiber A connects to a port where nothing listens, so its
// client retries with backoff (a timed wait on its condition variable) for connect_timeout;
// fiber B meanwhile takes 50 naps of 10 ms. With the hooks, B finishes in about 0.5 s, long
// before A gives up at 5 s; without them each backoff blocks the thread, B's naps wait behind
// A's, and B finishes only after A. Exit 0 when B finished first.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "bench/bench_support.h"
#include "bench/rendezvous/fiber_loop.h"
#include "rendezvous/tcp/tcp_store_client.h"

using namespace dlaunch;

namespace {

// A loopback port nothing listens on: bound (so no one else takes it) and never listened.
int closed_port(int* fd_out) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return -1;
  }
  *fd_out = fd;
  return ntohs(a.sin_port);
}

}  // namespace

int main() {
  int holder = -1;
  const int port = closed_port(&holder);
  if (port < 0) {
    std::perror("fiber_wait_check: cannot reserve a loopback port");
    return 1;
  }
  sim::FiberLoop loop;
  // The loop stops from its own turn (stop() from a fiber would leave it in an idle epoll_wait):
  // the fiber that finishes last writes to `done`, which the loop watches.
  int done[2];
  if (pipe(done) != 0) return 1;
  int64_t a_gave_up = 0, b_done = 0;
  loop.spawn([&] {
    TcpStoreClientOptions o;
    o.port = static_cast<uint16_t>(port);
    o.connect_timeout = std::chrono::seconds(5);
    o.lazy_connect = true;
    try {
      TcpStoreClient client(o);
      client.connect();
    } catch (const std::exception&) {
      // expected: nothing listens
    }
    a_gave_up = bench::mono_ns();
    if (b_done) (void)!write(done[1], "x", 1);
  });
  loop.spawn([&] {
    for (int i = 0; i < 50; ++i) loop.sleep_ms(10);
    b_done = bench::mono_ns();
    if (a_gave_up) (void)!write(done[1], "x", 1);
  });
  loop.run(done[0], [&] { loop.stop(); });
  ::close(holder);
  const bool ok = b_done < a_gave_up;
  std::printf("fiber_wait_check: the napping fiber finished %.3f s %s the backing-off one gave up "
              "(%s)\n",
              std::abs(a_gave_up - b_done) / 1e9, ok ? "before" : "after",
              ok ? "a connect backoff parks only its fiber" :
                   "FAILED: a connect backoff held the whole thread");
  return ok ? 0 : 1;
}
