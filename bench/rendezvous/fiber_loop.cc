// See fiber_loop.h. One loop per process (rdzv_sim's agent processes run one each).
#include "bench/rendezvous/fiber_loop.h"

#include <dlfcn.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <ucontext.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <unordered_set>
#include <vector>

namespace dlaunch::sim {
namespace {

// 256 KiB of address space each, like the thread driver's stacks; only touched pages cost
// memory (a join touches a few tens of KiB).
constexpr size_t kStackBytes = 256 * 1024;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Fiber {
  ucontext_t context{};
  void* stack = nullptr;
  std::function<void()> body;
  bool done = false;
  bool timed_out = false;
  std::multimap<int64_t, Fiber*>::iterator timer;
  bool has_timer = false;
  int waiting_fd = -1;
};

struct Loop {
  ucontext_t main{};
  Fiber* current = nullptr;
  std::deque<Fiber*> ready;
  std::multimap<int64_t, Fiber*> timers;
  std::unordered_set<int> registered;  // fds in the epoll set (EPOLLONESHOT, re-armed per wait)
  int epoll_fd = -1;
};

Loop& loop() {
  static Loop l;
  return l;
}
thread_local bool t_loop_thread = false;

Fiber* current_fiber() {
  return t_loop_thread ? loop().current : nullptr;
}

void trampoline() {
  Fiber* f = loop().current;
  try {
    f->body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdzv_sim: fiber ended with: %s\n", e.what());
  }
  f->done = true;
  // uc_link returns to the loop.
}

// Parks the current fiber until it is made ready again (by its fd or its timer).
void park(Fiber* f) {
  swapcontext(&f->context, &loop().main);
}

void arm_timer(Fiber* f, int64_t deadline_ns) {
  f->timer = loop().timers.emplace(deadline_ns, f);
  f->has_timer = true;
  f->timed_out = false;
}

void make_ready(Fiber* f) {
  f->waiting_fd = -1;  // a late event for the same wait must not queue it twice
  if (f->has_timer) {
    loop().timers.erase(f->timer);
    f->has_timer = false;
  }
  loop().ready.push_back(f);
}

// Parks until `fd` has `events` or `timeout_ms` passes (< 0: no limit). True when ready.
bool wait_fd(Fiber* f, int fd, uint32_t events, int64_t timeout_ms) {
  Loop& l = loop();
  epoll_event ev{};
  ev.events = events | EPOLLONESHOT;
  ev.data.ptr = f;
  f->timed_out = false;
  // An fd closed and reused (a reconnect) has left the set; one already in it is re-armed.
  int op = l.registered.count(fd) ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
  int r = epoll_ctl(l.epoll_fd, op, fd, &ev);
  if (r != 0 && (errno == ENOENT || errno == EEXIST)) {
    r = epoll_ctl(l.epoll_fd, errno == ENOENT ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev);
  }
  if (r != 0) {
    std::fprintf(stderr, "rdzv_sim: epoll_ctl(%d): %s\n", fd, std::strerror(errno));
    std::abort();
  }
  l.registered.insert(fd);
  f->waiting_fd = fd;
  if (timeout_ms >= 0) arm_timer(f, now_ns() + timeout_ms * 1000000);
  park(f);
  if (f->timed_out) {
    // Disarm, so a late readiness does not wake the fiber in another wait.
    epoll_event off{};
    off.data.ptr = nullptr;
    epoll_ctl(l.epoll_fd, EPOLL_CTL_MOD, fd, &off);
    return false;
  }
  return true;
}

template <typename F>
F real(const char* name) {
  static_assert(sizeof(F) == sizeof(void*));
  void* p = dlsym(RTLD_NEXT, name);
  if (p == nullptr) std::abort();
  return reinterpret_cast<F>(p);
}
using PollFn = int (*)(pollfd*, nfds_t, int);
using RecvFn = ssize_t (*)(int, void*, size_t, int);
using SendFn = ssize_t (*)(int, const void*, size_t, int);
PollFn real_poll() {
  static PollFn f = real<PollFn>("poll");
  return f;
}
RecvFn real_recv() {
  static RecvFn f = real<RecvFn>("recv");
  return f;
}
SendFn real_send() {
  static SendFn f = real<SendFn>("send");
  return f;
}

}  // namespace

void spawn_fiber(std::function<void()> body) {
  auto* f = new Fiber;
  f->body = std::move(body);
  f->stack = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (f->stack == MAP_FAILED) {
    std::perror("rdzv_sim: fiber stack");
    std::abort();
  }
  getcontext(&f->context);
  f->context.uc_stack.ss_sp = f->stack;
  f->context.uc_stack.ss_size = kStackBytes;
  f->context.uc_link = &loop().main;
  makecontext(&f->context, trampoline, 0);
  loop().ready.push_back(f);
}

void fiber_sleep_ns(int64_t ns) {
  Fiber* f = current_fiber();
  arm_timer(f, now_ns() + ns);
  park(f);
}

void run_fiber_loop(int watch_fd, const std::function<void()>& on_readable,
                    const std::function<bool()>& stop) {
  Loop& l = loop();
  t_loop_thread = true;
  l.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  static int watch_tag;  // epoll data for watch_fd, told apart from fibers
  if (watch_fd >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &watch_tag;
    epoll_ctl(l.epoll_fd, EPOLL_CTL_ADD, watch_fd, &ev);
  }
  std::vector<epoll_event> events(1024);
  while (!stop()) {
    while (!l.ready.empty()) {
      Fiber* f = l.ready.front();
      l.ready.pop_front();
      l.current = f;
      swapcontext(&l.main, &f->context);
      l.current = nullptr;
      if (f->done) {
        munmap(f->stack, kStackBytes);
        delete f;
      }
    }
    int timeout_ms = 50;
    if (!l.timers.empty()) {
      int64_t left = l.timers.begin()->first - now_ns();
      timeout_ms = static_cast<int>(std::clamp<int64_t>((left + 999999) / 1000000, 0, 50));
    }
    int n = epoll_wait(l.epoll_fd, events.data(), static_cast<int>(events.size()), timeout_ms);
    for (int i = 0; i < n; ++i) {
      void* tag = events[i].data.ptr;
      if (tag == &watch_tag) {
        on_readable();
      } else if (tag != nullptr) {
        auto* f = static_cast<Fiber*>(tag);
        if (f->waiting_fd >= 0) make_ready(f);
      }
    }
    int64_t now = now_ns();
    while (!l.timers.empty() && l.timers.begin()->first <= now) {
      Fiber* f = l.timers.begin()->second;
      l.timers.erase(l.timers.begin());
      f->has_timer = false;
      f->timed_out = true;
      f->waiting_fd = -1;
      l.ready.push_back(f);
    }
  }
  t_loop_thread = false;
}

}  // namespace dlaunch::sim

// --- the interposed calls ----------------------------------------------------------------------
using dlaunch::sim::current_fiber;
using dlaunch::sim::real_poll;
using dlaunch::sim::real_recv;
using dlaunch::sim::real_send;

extern "C" int poll(pollfd* fds, nfds_t nfds, int timeout) {
  auto* f = current_fiber();
  if (f == nullptr || nfds != 1 || timeout == 0) return real_poll()(fds, nfds, timeout);
  int r = real_poll()(fds, 1, 0);
  if (r != 0) return r;
  if (!dlaunch::sim::wait_fd(f, fds[0].fd, static_cast<uint32_t>(fds[0].events), timeout)) {
    return 0;
  }
  return real_poll()(fds, 1, 0);
}

extern "C" ssize_t recv(int fd, void* buf, size_t len, int flags) {
  auto* f = current_fiber();
  if (f == nullptr) return real_recv()(fd, buf, len, flags);
  while (true) {
    ssize_t r = real_recv()(fd, buf, len, flags | MSG_DONTWAIT);
    if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return r;
    // The socket's SO_RCVTIMEO (the client's deadline) bounds the wait, as it would the recv.
    timeval tv{};
    socklen_t tl = sizeof(tv);
    int64_t timeout_ms = -1;
    if (getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &tl) == 0 && (tv.tv_sec || tv.tv_usec)) {
      timeout_ms = int64_t(tv.tv_sec) * 1000 + tv.tv_usec / 1000;
    }
    if (!dlaunch::sim::wait_fd(f, fd, EPOLLIN | EPOLLRDHUP, timeout_ms)) {
      errno = EAGAIN;
      return -1;
    }
  }
}

extern "C" ssize_t send(int fd, const void* buf, size_t len, int flags) {
  auto* f = current_fiber();
  if (f == nullptr) return real_send()(fd, buf, len, flags);
  while (true) {
    ssize_t r = real_send()(fd, buf, len, flags | MSG_DONTWAIT);
    if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return r;
    dlaunch::sim::wait_fd(f, fd, EPOLLOUT, -1);
  }
}
