// Runs the stack capture tool (stack_capture.h picks it) for a hung worker through the process
// context: its output, up to 1 MiB, goes to the worker's stack.txt, and a tool that does not
// finish within the timeout is killed (a gdb stuck on a worker in uninterruptible sleep must
// not hold up the restart). The agent decides what happens next (agent.cc).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"
#include "launcher/process/process_context.h"

namespace boost::asio {
class io_context;
}

namespace dlaunch {

class StackCaptureRun {
 public:
  struct Callbacks {
    // The tool ended (also after the kill); its output is already in the file.
    std::function<void(const ExitStatus& status, const std::string& text)> on_done;
    // The tool could not be executed.
    std::function<void(const std::string& message)> on_failed;
  };

  StackCaptureRun(ProcessContext& procs, boost::asio::io_context& io);
  ~StackCaptureRun();
  StackCaptureRun(const StackCaptureRun&) = delete;
  StackCaptureRun& operator=(const StackCaptureRun&) = delete;

  // Starts the tool; throws what ProcessContext::spawn throws. One capture at a time.
  void start(SpawnRequest req, const std::string& out_path, Duration timeout, Callbacks cb);
  // Stops the timeout (the agent is finishing); the tool's callbacks may still come.
  void cancel();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlaunch
