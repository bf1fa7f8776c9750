#include "worker/train/stop_signal.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <thread>

namespace dlaunch::train {
namespace {

std::atomic<int> g_requested{0};
std::atomic<bool> g_armed{false};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "used from a signal handler");

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGTERM);
  return set;
}

// The default action of `sig` (termination) for the whole process. Async-signal-safe: inside a
// handler the raised signal stays pending until the handler returns, then kills.
void die_by(int sig) {
  ::signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  ::raise(sig);
}

// Async-signal-safe: atomics and die_by only (the trainer logs the request when it acts on it).
// Idempotent once armed: Slurm with proctrack/linuxproc signals the workers itself and dlaunch
// forwards the same signal, and the SIGTERM that follows a notice must not cut the checkpoint
// short (whoever must stop dtrain at once has SIGKILL, as dlaunch after --shutdown_grace).
void on_stop_signal(int sig) {
  if (!g_armed.load()) return die_by(sig);
  int expected = 0;
  g_requested.compare_exchange_strong(expected, sig);
}

void wait_loop() {
  const sigset_t set = stop_set();
  for (;;) {
    int sig = 0;
    if (::sigwait(&set, &sig) == 0) on_stop_signal(sig);
  }
}

}  // namespace

void install_stop_signals() {
  // Threads started before main (OpenBLAS's pool is created when the library loads) do not
  // have the mask: a signal the kernel hands to one of them runs the handler there instead,
  // with the same effect. SA_RESTART: those threads only wait on futexes.
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  const sigset_t set = stop_set();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread(wait_loop).detach();
}

const char* stop_signal_name(int sig) {
  switch (sig) {
    case SIGUSR1:
      return "SIGUSR1";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "a signal";
  }
}

void arm_stop_signals(bool armed) { g_armed.store(armed); }

int stop_requested() { return g_requested.load(std::memory_order_relaxed); }

}  // namespace dlaunch::train
