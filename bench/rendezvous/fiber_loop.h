// Many cooperative fibers on one thread, for rdzv_sim's fiber driver: each simulated agent
// runs the real rendezvous state machine on a fiber of its own (a small mmap'd stack, not an
// OS thread), and its socket calls yield to one epoll loop (fiber_socket_hooks.cc), so 16,384
// agents cost 16,384 stacks and sockets in a few processes, not 16,384 scheduled threads.
//
// Not thread-safe: one FiberLoop per process, driven and used from one thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <unordered_map>
#include <vector>

namespace dlaunch::sim {

struct Fiber;

class FiberLoop {
 public:
  FiberLoop();
  ~FiberLoop();
  FiberLoop(const FiberLoop&) = delete;
  FiberLoop& operator=(const FiberLoop&) = delete;

  // Starts `body` on a new fiber at the next turn of the loop. It must not throw.
  void spawn(std::function<void()> body);
  // Runs fibers and waits for I/O and timers until `stop()`; `on_readable` is called (on the
  // loop, not a fiber) whenever `watched_fd` (e.g. a command pipe) can be read.
  void run(int watched_fd, const std::function<void()>& on_readable);
  void stop() { stopping_ = true; }

  // From a fiber: yield until `fd` has `epoll_events` or `timeout_ms` passed (-1: no limit).
  // Returns false on timeout.
  bool wait_fd(int fd, uint32_t epoll_events, int timeout_ms);
  // From a fiber: yield for `ms` milliseconds.
  void sleep_ms(int64_t ms);
  // From a fiber, what a blocking wait of the socket hooks becomes: `look()` (a non-blocking
  // check: > 0 ready, < 0 error, 0 not yet) until it is not 0, parking the fiber on `fd` for
  // `epoll_events` in between; 0 once `timeout_ms` passed (-1: no limit).
  int wait_until(int fd, uint32_t epoll_events, int timeout_ms, const std::function<int()>& look);

  // The loop whose fiber is running on this thread, or nullptr (the thread driver, the store
  // host, the loop itself between fibers): the socket hooks block normally then.
  static FiberLoop* current();

  // A thread-local pointer a library keeps per call stack, which must follow the fiber rather
  // than the thread: Asio's record of the io_context running on this thread (a fiber parked
  // inside one io_context's run() while another fiber enters its own would otherwise leave
  // that record pointing into a finished frame). Every loop swaps each slot at every switch:
  // a fiber starts with nullptr, and the loop's own value is kept aside while a fiber runs.
  // Register before the first loop is made (fiber_asio_hooks.cc does, at start-up).
  struct FiberLocal {
    void* (*load)();
    void (*store)(void*);
  };
  static void add_fiber_local(FiberLocal slot);

 private:
  struct Timer {
    int64_t at_ns;
    Fiber* fiber;
    uint64_t wait_id;
    bool operator>(const Timer& o) const { return at_ns > o.at_ns; }
  };
  struct FdWaiter {
    Fiber* fiber;
    uint64_t wait_id;
  };
  bool park(int64_t timeout_ms);  // yields; true when woken by I/O, false by the timer
  void wake(Fiber* f, uint64_t wait_id, bool by_io);
  void resume(Fiber* f);

  int epoll_fd_ = -1;
  bool stopping_ = false;
  std::vector<std::unique_ptr<Fiber>> fibers_;
  std::queue<Fiber*> ready_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  std::unordered_map<int, FdWaiter> fd_waiters_;
};

}  // namespace dlaunch::sim
