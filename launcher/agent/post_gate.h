// How the agent's helper threads (rendezvous round, failure verdict, exit barrier, the handler's
// watcher) hand results back to the loop thread. A thread still blocked when the agent is
// destroyed (stopped by a signal) must never touch a dead io_context: the agent closes the gate
// first, and the gate, not the agent, knows the loop, so such a thread reads no member of the (by
// then freed) agent, not even its io_context reference.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <memory>
#include <mutex>
#include <utility>

namespace dlaunch {

struct PostGate {
  explicit PostGate(boost::asio::io_context& i) : io(i) {}
  std::mutex mutex;
  bool open = true;
  boost::asio::io_context& io;  // used only while open

  // After this nothing more is posted; handlers already posted stay queued.
  void close() {
    std::lock_guard<std::mutex> lock(mutex);
    open = false;
  }
};

// Posts `f` to the gate's loop unless the gate is closed. Callable from any thread.
template <typename F>
void post_from_thread(const std::shared_ptr<PostGate>& gate, F f) {
  std::lock_guard<std::mutex> lock(gate->mutex);
  if (gate->open) boost::asio::post(gate->io, std::move(f));
}

}  // namespace dlaunch
