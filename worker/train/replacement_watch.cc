#include "worker/train/replacement_watch.h"

#include <fmt/format.h>

#include <chrono>

#include "common/error.h"
#include "common/log.h"

namespace dlaunch::train {

namespace {

// One store request per slice and worker, so a long one (a job of thousands of workers sends its
// agent's store that many a minute); the server answers at once when the key appears, and a stop
// interrupts the wait (repeatedly, so one that fell between two calls is not lost).
constexpr std::chrono::milliseconds kWatchSlice{60000};
constexpr std::chrono::milliseconds kStopRetry{5};

}  // namespace

ReplacementWatch::ReplacementWatch(std::string key, int64_t generation,
                                   std::function<std::shared_ptr<Store>()> connect)
    : key_(std::move(key)), connect_(std::move(connect)) {
  thread_ = std::thread([this, next = generation + 1] { run(next); });
}

ReplacementWatch::~ReplacementWatch() {
  stop_ = true;
  // The thread may be inside a wait (interrupted here: once is not enough when the interrupt
  // falls between two of its calls) or between two calls (it sees stop_).
  while (!stopped_.load(std::memory_order_acquire)) {
    if (client_ready_.load(std::memory_order_acquire)) client_->interrupt();
    std::this_thread::sleep_for(kStopRetry);
  }
  thread_.join();
}

void ReplacementWatch::run(int64_t next) {
  try {
    client_ = connect_();
    client_ready_.store(true, std::memory_order_release);
    while (!stop_) {
      const std::string verdict_key = fmt::format("{}/{}", key_, next);
      WaitGetResult r;
      try {
        r = client_->wait_get({verdict_key}, kWatchSlice);
      } catch (const StoreInterruptedError&) {
        continue;  // stopping
      }
      if (!r.ready) continue;
      const std::string verdict = r.values.front() ? to_string(*r.values.front()) : "";
      // A shrink re-forms the group as a replacement does (a node of it was lost).
      if (verdict == "replace" || verdict.rfind("shrink ", 0) == 0) {
        replaced_.store(next, std::memory_order_release);
        log_debug("the agent announced generation {} ({}): abandoning this step", next, verdict);
      }
      ++next;
    }
  } catch (const std::exception& e) {
    if (!stop_) log_debug("watching for rank replacements stopped: {}", e.what());
  }
  stopped_.store(true, std::memory_order_release);
}

}  // namespace dlaunch::train
