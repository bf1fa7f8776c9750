#include "bench/rendezvous/fiber_loop.h"

#include <sys/epoll.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "bench/bench_support.h"
#include "common/error.h"

namespace dlaunch::sim {

// 256 KiB, as the thread driver's stacks: next_rendezvous() formats and throws on them. Only
// the pages touched are ever backed; a guard page below catches an overflow.
constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kGuardBytes = 4096;

struct Fiber {
  ucontext_t context{};
  void* mapping = nullptr;
  std::function<void()> body;
  bool done = false;
  uint64_t wait_id = 0;  // which park() a timer or an fd event belongs to
  bool parked = false;
  bool woken_by_io = false;
  std::vector<void*> locals;  // the FiberLocal slots' values while the fiber is not running
};

namespace {
std::vector<FiberLoop::FiberLocal>& fiber_locals() {
  static std::vector<FiberLoop::FiberLocal> slots;
  return slots;
}

// Puts `f`'s values of the slots in place and keeps the current ones in `f` (so calling it again
// swaps back).
void swap_locals(Fiber* f) {
  auto& slots = fiber_locals();
  f->locals.resize(slots.size(), nullptr);
  for (size_t i = 0; i < slots.size(); ++i) {
    void* outside = slots[i].load();
    slots[i].store(f->locals[i]);
    f->locals[i] = outside;
  }
}

thread_local FiberLoop* t_loop = nullptr;  // set while one of its fibers runs
thread_local Fiber* t_fiber = nullptr;
thread_local ucontext_t t_loop_context;

void fiber_main() {
  Fiber* f = t_fiber;
  try {
    f->body();
  } catch (const std::exception& e) {
    // Nothing can catch it past this frame: say where it came from before the abort.
    std::fprintf(stderr, "rdzv_sim: an exception escaped a fiber (a simulator bug: its body "
                         "must catch what it calls): %s\n", e.what());
    std::abort();
  }
  f->done = true;
  swapcontext(&f->context, &t_loop_context);
}
}  // namespace

FiberLoop::FiberLoop() : epoll_fd_(epoll_create1(EPOLL_CLOEXEC)) {
  if (epoll_fd_ < 0) throw SystemError("rdzv_sim: epoll_create1 failed");
}

FiberLoop::~FiberLoop() {
  for (auto& f : fibers_) munmap(f->mapping, kStackBytes + kGuardBytes);
  ::close(epoll_fd_);
}

FiberLoop* FiberLoop::current() {
  return t_loop;
}

void FiberLoop::add_fiber_local(FiberLocal slot) {
  fiber_locals().push_back(slot);
}

void FiberLoop::spawn(std::function<void()> body) {
  auto f = std::make_unique<Fiber>();
  f->body = std::move(body);
  f->mapping = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (f->mapping == MAP_FAILED) throw SystemError("rdzv_sim: mmap of a fiber stack failed");
  mprotect(f->mapping, kGuardBytes, PROT_NONE);
  getcontext(&f->context);
  f->context.uc_stack.ss_sp = static_cast<char*>(f->mapping) + kGuardBytes;
  f->context.uc_stack.ss_size = kStackBytes;
  f->context.uc_link = nullptr;
  makecontext(&f->context, fiber_main, 0);
  ready_.push(f.get());
  fibers_.push_back(std::move(f));
}

void FiberLoop::resume(Fiber* f) {
  t_loop = this;
  t_fiber = f;
  swap_locals(f);  // the fiber's values in, the loop's kept in f
  swapcontext(&t_loop_context, &f->context);
  swap_locals(f);  // the loop's values back, the fiber's kept for its next turn
  t_loop = nullptr;
  t_fiber = nullptr;
  if (f->done) {
    // Its stack is freed with the loop: a finished agent's fiber is rare (only at shutdown).
    f->body = nullptr;
  }
}

bool FiberLoop::park(int64_t timeout_ms) {
  Fiber* f = t_fiber;
  f->parked = true;
  f->woken_by_io = false;
  if (timeout_ms >= 0) timers_.push({bench::mono_ns() + timeout_ms * 1000000, f, f->wait_id});
  swapcontext(&f->context, &t_loop_context);
  return f->woken_by_io;
}

void FiberLoop::wake(Fiber* f, uint64_t wait_id, bool by_io) {
  if (!f->parked || f->wait_id != wait_id) return;  // a stale timer or event
  f->parked = false;
  f->woken_by_io = by_io;
  ++f->wait_id;
  ready_.push(f);
}

bool FiberLoop::wait_fd(int fd, uint32_t epoll_events, int timeout_ms) {
  Fiber* f = t_fiber;
  epoll_event ev{};
  ev.events = epoll_events | EPOLLONESHOT;
  ev.data.fd = fd;
  // The fd may be new, re-armed, or a reused number of a closed one (closing removes it).
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev) != 0 &&
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    throw SystemError("rdzv_sim: epoll_ctl on a store socket failed");
  }
  fd_waiters_[fd] = {f, f->wait_id};
  bool by_io = park(timeout_ms);
  if (!by_io) fd_waiters_.erase(fd);
  return by_io;
}

int FiberLoop::wait_until(int fd, uint32_t epoll_events, int timeout_ms, const std::function<int()>& look) {
  const int64_t deadline = timeout_ms < 0 ? -1 : dlaunch::bench::mono_ns() + int64_t(timeout_ms) * 1000000;
  for (;;) {
    const int r = look();
    if (r != 0) return r;
    int left = -1;
    if (deadline >= 0) {
      const int64_t ns = deadline - dlaunch::bench::mono_ns();
      if (ns <= 0) return 0;
      left = static_cast<int>((ns + 999999) / 1000000);
    }
    if (!wait_fd(fd, epoll_events, left)) return 0;
  }
}

void FiberLoop::sleep_ms(int64_t ms) {
  park(ms);
}

void FiberLoop::run(int watched_fd, const std::function<void()>& on_readable) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = watched_fd;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, watched_fd, &ev) != 0) {
    throw SystemError("rdzv_sim: epoll_ctl on the command pipe failed");
  }
  std::vector<epoll_event> events(1024);
  while (!stopping_) {
    while (!ready_.empty() && !stopping_) {
      Fiber* f = ready_.front();
      ready_.pop();
      resume(f);
    }
    int64_t now = bench::mono_ns();
    int timeout = -1;
    if (!timers_.empty()) {
      timeout =
          static_cast<int>(std::max<int64_t>(0, (timers_.top().at_ns - now + 999999) / 1000000));
    }
    int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout);
    if (n < 0 && errno != EINTR) throw SystemError("rdzv_sim: epoll_wait failed");
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == watched_fd) {
        on_readable();
        continue;
      }
      auto it = fd_waiters_.find(fd);
      if (it == fd_waiters_.end()) continue;
      FdWaiter w = it->second;
      fd_waiters_.erase(it);
      wake(w.fiber, w.wait_id, true);
    }
    now = bench::mono_ns();
    while (!timers_.empty() && timers_.top().at_ns <= now) {
      Timer t = timers_.top();
      timers_.pop();
      wake(t.fiber, t.wait_id, false);
    }
  }
}

}  // namespace dlaunch::sim
