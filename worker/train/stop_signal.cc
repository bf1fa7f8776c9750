#include "worker/train/stop_signal.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <memory>
#include <thread>

#include "common/log.h"
#include "worker/train/stop_watchdog.h"

namespace dlaunch::train {
namespace {

std::atomic<int> g_requested{0};
std::atomic<bool> g_armed{false};
// The thread that takes the signals, once it runs.
std::atomic<bool> g_waiter_ready{false};
pthread_t g_waiter;
// Set once by watch_stop_signals and never freed: the signal thread may read it at any time.
std::atomic<StopWatchdog*> g_watchdog{nullptr};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "used from a signal handler");

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
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
// A second SIGINT is the user insisting (Ctrl-C twice): it ends the process at once.
void record_or_die(int sig) {
  if (!g_armed.load()) return die_by(sig);
  int expected = 0;
  if (!g_requested.compare_exchange_strong(expected, sig) && sig == SIGINT &&
      expected == SIGINT) {
    die_by(sig);
  }
}

// A thread started before main took the signal: the signal thread must see it too, to start
// the watchdog's clock, so it is passed on there (pthread_kill is async-signal-safe).
void on_stop_signal(int sig) {
  if (g_waiter_ready.load()) {
    ::pthread_kill(g_waiter, sig);
    return;
  }
  record_or_die(sig);
}

// The next stop signal, or 0 once `deadline` passed first.
int next_signal(const sigset_t& set, const std::optional<TimePoint>& deadline) {
  if (!deadline) {
    int sig = 0;
    return ::sigwait(&set, &sig) == 0 ? sig : 0;
  }
  const Duration left = std::max(Duration::zero(), *deadline - steady_clock().now());
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(std::chrono::duration_cast<std::chrono::seconds>(left).count());
  ts.tv_nsec = static_cast<long>((left % std::chrono::seconds(1)).count());
  const int sig = ::sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;  // EAGAIN: the deadline; EINTR: another signal's handler ran
}

// No step boundary came in time after `sig`: end the process by `sig`, as an unarmed worker
// would have at once, with the reason in the log.
[[noreturn]] void give_up(const StopWatchdog& dog, int sig) {
  const TimePoint requested = dog.requested_at().value_or(steady_clock().now());
  log_warning(
      "stop watchdog: {} came {:.1f} s ago and no step or evaluation batch ended since "
      "(the limit: {}); this worker is blocked, most likely in a collective with a lost "
      "peer, so it ends now by {} without a stop checkpoint (a resume takes the last "
      "checkpoint or flash copy)",
      stop_signal_name(sig), to_seconds(steady_clock().now() - requested), dog.explain_bound(),
      stop_signal_name(sig));
  die_by(sig);
  ::_exit(128 + sig);  // not reached: the default action of SIGTERM and SIGUSR1 terminates
}

void wait_loop() {
  g_waiter = ::pthread_self();
  g_waiter_ready.store(true);
  const sigset_t set = stop_set();
  for (;;) {
    StopWatchdog* dog = g_watchdog.load();
    const int requested = g_requested.load();
    const std::optional<TimePoint> deadline =
        dog && requested != 0 ? dog->deadline() : std::nullopt;
    if (deadline && steady_clock().now() >= *deadline) give_up(*dog, requested);
    const int sig = next_signal(set, deadline);
    if (sig == 0) continue;
    record_or_die(sig);
    // Loaded again: the watchdog may have been started while this thread waited.
    if (StopWatchdog* now_watching = g_watchdog.load()) now_watching->stop_requested();
  }
}

}  // namespace

void install_stop_signals() {
  // Threads started before main (OpenBLAS's pool is created when the library loads) do not
  // have the mask: a signal the kernel hands to one of them runs the handler there, which
  // passes it on to the signal thread. SA_RESTART: those threads only wait on futexes.
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
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
    case SIGINT:
      return "SIGINT";
    default:
      return "a signal";
  }
}

void arm_stop_signals(bool armed) { g_armed.store(armed); }

int stop_requested() { return g_requested.load(std::memory_order_relaxed); }

void watch_stop_signals(int64_t steps_per_check, std::optional<Duration> grace) {
  auto dog = std::make_unique<StopWatchdog>(steady_clock(), steps_per_check, grace);
  StopWatchdog* none = nullptr;
  if (g_watchdog.compare_exchange_strong(none, dog.get())) static_cast<void>(dog.release());
}

void stop_watch_progress(bool step) {
  if (StopWatchdog* dog = g_watchdog.load()) dog->progress(step);
}

void stop_watch_settle() {
  if (StopWatchdog* dog = g_watchdog.load()) dog->settle();
}

}  // namespace dlaunch::train
