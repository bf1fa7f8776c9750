// The socket calls TcpStoreClient makes (send, recv, poll), made to yield when called on a
// FiberLoop's fiber: the real client, unchanged, then speaks the real protocol on one socket
// per simulated agent while thousands of agents share one thread.
//
// These definitions in rdzv_sim's executable take the place of libc's for every caller in it
// (ELF symbol interposition). Off a fiber (the thread driver, the store host process, the
// driver's own pipes) they do exactly what libc's do, through the same system calls; so they
// do on a socket its owner made non-blocking (Asio's send and recv, a store proxy's), which
// asked for EAGAIN rather than a wait.
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>

#include "bench/rendezvous/fiber_loop.h"

using dlaunch::sim::FiberLoop;

namespace {

// The socket's SO_RCVTIMEO in ms (-1: none), as a blocking recv() would honour it.
int receive_timeout_ms(int fd) {
  timeval tv{};
  socklen_t len = sizeof(tv);
  if (getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &len) != 0) return -1;
  if (tv.tv_sec == 0 && tv.tv_usec == 0) return -1;
  return static_cast<int>(tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000);
}

// A socket the caller made non-blocking (Asio's, in the store proxy a simulated node starts
// from its fiber) asked for EAGAIN, not a wait: asked only once a call would block.
bool non_blocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_NONBLOCK);
}

uint32_t epoll_events_of(short poll_events) {
  uint32_t e = 0;
  if (poll_events & POLLIN) e |= EPOLLIN;
  if (poll_events & POLLOUT) e |= EPOLLOUT;
  return e | EPOLLRDHUP;
}

}  // namespace

extern "C" ssize_t recv(int fd, void* buf, size_t len, int flags) {
  FiberLoop* loop = FiberLoop::current();
  if (loop == nullptr || (flags & MSG_DONTWAIT))
    return recvfrom(fd, buf, len, flags, nullptr, nullptr);
  for (;;) {
    ssize_t r = recvfrom(fd, buf, len, flags | MSG_DONTWAIT, nullptr, nullptr);
    if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || non_blocking(fd)) return r;
    if (!loop->wait_fd(fd, EPOLLIN | EPOLLRDHUP, receive_timeout_ms(fd))) {
      errno = EAGAIN;  // what SO_RCVTIMEO makes a blocking recv() return
      return -1;
    }
  }
}

extern "C" ssize_t send(int fd, const void* buf, size_t len, int flags) {
  FiberLoop* loop = FiberLoop::current();
  if (loop == nullptr || (flags & MSG_DONTWAIT)) return sendto(fd, buf, len, flags, nullptr, 0);
  for (;;) {
    ssize_t r = sendto(fd, buf, len, flags | MSG_DONTWAIT, nullptr, 0);
    if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || non_blocking(fd)) return r;
    loop->wait_fd(fd, EPOLLOUT, -1);
  }
}

extern "C" int poll(struct pollfd* fds, nfds_t nfds, int timeout) {
  FiberLoop* loop = FiberLoop::current();
  auto at_most = [](int ms) {
    timespec ts{ms / 1000, (ms % 1000) * 1000000L};
    return ts;
  };
  if (loop == nullptr || nfds != 1 || timeout == 0) {
    timespec ts = at_most(timeout);
    return ppoll(fds, nfds, timeout < 0 ? nullptr : &ts, nullptr);
  }
  // One fd (all TcpStoreClient polls): look, then yield until it is ready or time is up.
  return loop->wait_until(fds[0].fd, epoll_events_of(fds[0].events), timeout, [&] {
    timespec zero{0, 0};
    return ppoll(fds, 1, &zero, nullptr);
  });
}
