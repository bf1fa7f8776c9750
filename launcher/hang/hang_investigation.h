// What the agent does between "a worker is hung" and stopping the group: asks every silent
// worker for its Python stacks (python_hooks.h), captures their native stacks one after the
// other (stack_capture_run.h; each bounded by the capture timeout), then reads and diagnoses
// them (hang_diagnosis.h). Runs on the agent's loop; the callback comes there too.
//
//   start -> Python stack requests (all at once) -> native capture 0 .. N-1 -> wait until the
//   Python dumps had kPythonDumpWait -> read, diagnose -> on_done(findings)
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "launcher/hang/hang_diagnosis.h"
#include "launcher/process/process_context.h"

namespace boost::asio {
class io_context;
}

namespace dlaunch {

// faulthandler writes from its signal handler at once; this covers scheduling on a busy host.
inline constexpr Duration kPythonDumpWait = std::chrono::milliseconds(300);

class HangInvestigation {
 public:
  struct Target {
    int64_t local_rank = 0;
    int64_t global_rank = 0;
    int pid = 0;
    std::string log_dir;  // stack.txt (native) and py_stack.txt (Python) live there
  };
  struct Result {
    Target target;
    HangFinding finding;
    bool python_requested = false;  // the worker had registered dlaunch's Python hooks
    std::string native_note;        // the tool's end ("exit code 0") or why there is none
  };
  struct Options {
    bool native = true;                                    // run eu-stack/gdb
    std::string path_env;                                  // where to look for them
    std::vector<std::pair<std::string, std::string>> env;  // the tools' environment
    Duration timeout = std::chrono::seconds(15);           // per native capture
  };

  HangInvestigation(ProcessContext& procs, boost::asio::io_context& io);
  ~HangInvestigation();
  HangInvestigation(const HangInvestigation&) = delete;
  HangInvestigation& operator=(const HangInvestigation&) = delete;

  // One investigation at a time; never throws (a capture that cannot start is noted and
  // skipped). `on_done` gets one Result per target, in order.
  void start(std::vector<Target> targets, Options options,
             std::function<void(std::vector<Result>)> on_done);
  // The agent is finishing: no callback comes after this.
  void cancel();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The verdict on a hang, from the investigation's results. `suspects`: local ranks silent long
// enough to be the cause, the hung ones first. The root cause is the first suspect whose stacks
// show it outside a collective (pick_hang_root); `log` has one line per investigated worker
// ("local rank 0 (rank 0, silent): waits in a collective: ...") and the root cause's, with its
// Python stack. Pure.
struct HangVerdict {
  int64_t root = 0;  // a local rank
  HangFinding root_finding;
  std::vector<std::string> log;
};
HangVerdict judge_hang(const std::vector<int64_t>& suspects,
                       const std::vector<HangInvestigation::Result>& results);

}  // namespace dlaunch
