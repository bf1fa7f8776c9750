// The timed waits of the code rdzv_sim runs on fibers, made to park the fiber instead of the
// thread, as fiber_socket_hooks.cc does for socket calls: TcpStoreClient's backoff between
// connect attempts (a timed wait on its condition variable, so interrupt() can end it),
// DynamicRendezvous's pause after a store error (likewise), and the store proxy's pause
// between its connect attempts (a sleep). Each is a wait for time to pass; on a fiber, the
// thread blocking would stop every other fiber of the process with it: at 4,096 nodes, with
// 32,768 simulated workers connecting at once and some refused by the full listen queue, each
// backoff held thousands of workers for up to a second, and they starved each other's connects.
//
// On a fiber, a timed condition-variable wait releases the mutex, parks the fiber until the
// deadline, takes the mutex again and says it timed out: a notify from another thread does
// not end it early (allowed: the callers' predicates are checked again, and in the simulator
// nobody interrupts a fiber's client). Untimed waits and everything off a fiber are libc's.
// Definitions here take the place of libc's in this executable only (ELF symbol interposition).
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>

#include <cerrno>
#include <cstdint>

#include "bench/rendezvous/fiber_loop.h"

using dlaunch::sim::FiberLoop;

namespace {

int64_t now_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int64_t ns_of(const timespec& ts) { return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec; }

// Parks the fiber until `clock` reads `deadline_ns` (the loop's timers are whole ms: rounded up).
void park_until(FiberLoop* loop, clockid_t clock, int64_t deadline_ns) {
  for (int64_t left = deadline_ns - now_ns(clock); left > 0; left = deadline_ns - now_ns(clock)) {
    loop->sleep_ms((left + 999999) / 1000000);
  }
}

template <typename Fn>
Fn libc(const char* name, const char* version = nullptr) {
  void* f = version ? dlvsym(RTLD_NEXT, name, version) : dlsym(RTLD_NEXT, name);
  return reinterpret_cast<Fn>(f);
}

int fiber_cond_wait(FiberLoop* loop, pthread_mutex_t* mutex, clockid_t clock,
                    const timespec* abstime) {
  pthread_mutex_unlock(mutex);
  park_until(loop, clock, ns_of(*abstime));
  pthread_mutex_lock(mutex);
  return ETIMEDOUT;
}

}  // namespace

// std::condition_variable::wait_for/wait_until on the steady clock (libstdc++ 10 and later).
extern "C" int pthread_cond_clockwait(pthread_cond_t* cond, pthread_mutex_t* mutex,
                                      clockid_t clock, const timespec* abstime) {
  if (FiberLoop* loop = FiberLoop::current()) return fiber_cond_wait(loop, mutex, clock, abstime);
  using Fn = int (*)(pthread_cond_t*, pthread_mutex_t*, clockid_t, const timespec*);
  static const Fn real = libc<Fn>("pthread_cond_clockwait");
  return real(cond, mutex, clock, abstime);
}

// The system clock's (and Asio's) timed waits: a cond's clock is CLOCK_REALTIME by default.
extern "C" int pthread_cond_timedwait(pthread_cond_t* cond, pthread_mutex_t* mutex,
                                      const timespec* abstime) {
  if (FiberLoop* loop = FiberLoop::current()) {
    // A cond keeps the clock pthread_condattr_setclock gave it (Asio's: CLOCK_MONOTONIC), which
    // the public API cannot read back from the cond: told apart by the deadline's size (the
    // monotonic clock counts from boot, the real-time one from 1970).
    constexpr int64_t kYearNs = int64_t(365) * 86400 * 1000000000;
    const clockid_t clock =
        ns_of(*abstime) < now_ns(CLOCK_REALTIME) - kYearNs ? CLOCK_MONOTONIC : CLOCK_REALTIME;
    return fiber_cond_wait(loop, mutex, clock, abstime);
  }
  using Fn = int (*)(pthread_cond_t*, pthread_mutex_t*, const timespec*);
  static const Fn real = libc<Fn>("pthread_cond_timedwait", "GLIBC_2.3.2");
  return real(cond, mutex, abstime);
}

// std::this_thread::sleep_for.
extern "C" int nanosleep(const timespec* duration, timespec* remaining) {
  if (FiberLoop* loop = FiberLoop::current()) {
    park_until(loop, CLOCK_MONOTONIC, now_ns(CLOCK_MONOTONIC) + ns_of(*duration));
    if (remaining) *remaining = timespec{0, 0};
    return 0;
  }
  using Fn = int (*)(const timespec*, timespec*);
  static const Fn real = libc<Fn>("nanosleep");
  return real(duration, remaining);
}
