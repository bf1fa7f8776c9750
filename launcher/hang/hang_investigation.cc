#include "launcher/hang/hang_investigation.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "launcher/config/python_hooks.h"
#include "launcher/hang/stack_capture.h"
#include "launcher/hang/stack_capture_run.h"

namespace dlaunch {

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

struct HangInvestigation::Impl {
  Impl(ProcessContext& p, boost::asio::io_context& io) : procs(p), capture(p, io), timer(io) {}

  ProcessContext& procs;
  StackCaptureRun capture;
  boost::asio::steady_timer timer;
  // Bumped by start() and cancel(): a callback of an older investigation is ignored.
  int64_t run = 0;
  std::vector<Result> results;
  std::vector<std::optional<uint64_t>> py_offsets;
  Options options;
  std::function<void(std::vector<Result>)> on_done;
  TimePoint requested{};

  void capture_native(size_t i) {
    if (i == results.size()) return wait_for_python();
    Result& r = results[i];
    std::vector<std::string> argv = options.native
                                        ? stack_capture_command(r.target.pid, options.path_env)
                                        : std::vector<std::string>{};
    if (argv.empty()) {
      r.native_note = options.native ? "neither eu-stack nor gdb is installed" : "off";
      return capture_native(i + 1);
    }
    const int64_t me = run;
    auto advanced = std::make_shared<bool>(false);
    auto next = [this, me, i, advanced](std::string note) {
      if (me != run || *advanced) return;
      *advanced = true;
      results[i].native_note = std::move(note);
      capture_native(i + 1);
    };
    StackCaptureRun::Callbacks cb;
    cb.on_failed = [next](const std::string& message) { next("failed: " + message); };
    cb.on_done = [next](const ExitStatus& st, const std::string&) { next(st.describe()); };
    SpawnRequest req;
    req.argv = std::move(argv);
    req.env = options.env;
    try {
      capture.start(std::move(req), r.target.log_dir + "/stack.txt", options.timeout,
                    std::move(cb));
    } catch (const Error& e) {
      next(std::string("failed: ") + e.what());
    }
  }

  void wait_for_python() {
    Duration waited = steady_clock().now() - requested;
    const int64_t me = run;
    timer.expires_after(std::max<Duration>(kPythonDumpWait - waited, Duration::zero()));
    timer.async_wait([this, me](const boost::system::error_code& ec) {
      if (ec || me != run) return;
      for (size_t i = 0; i < results.size(); ++i) {
        Result& r = results[i];
        std::string py =
            py_offsets[i] ? read_python_stacks(r.target.log_dir + "/py_stack.txt", *py_offsets[i])
                          : std::string();
        std::string native = read_all(r.target.log_dir + "/stack.txt");
        r.finding = diagnose_hang(py, native, r.target.pid);
        // Stopped ("T"; "t" while a debugger traces it): its stack says where it was stopped.
        std::string state = procs.process_state(r.target.pid);
        if (state == "T" || state == "t") {
          r.finding.stopped = true;
          r.finding.where = "stopped (SIGSTOP, Ctrl-Z or a debugger) at " + r.finding.where;
        }
      }
      ++run;
      auto done = std::move(on_done);
      done(std::move(results));
    });
  }
};

HangInvestigation::HangInvestigation(ProcessContext& procs, boost::asio::io_context& io)
    : impl_(std::make_unique<Impl>(procs, io)) {}

HangInvestigation::~HangInvestigation() = default;

void HangInvestigation::start(std::vector<Target> targets, Options options,
                              std::function<void(std::vector<Result>)> on_done) {
  Impl& s = *impl_;
  ++s.run;
  s.options = std::move(options);
  s.on_done = std::move(on_done);
  s.results.clear();
  s.py_offsets.clear();
  s.requested = steady_clock().now();
  // Python first, for all: the dump shows where the worker was, before a ptrace attach stops it.
  for (auto& t : targets) {
    s.py_offsets.push_back(request_python_stacks(t.log_dir + "/py_stack.txt", t.pid));
    Result r;
    r.python_requested = s.py_offsets.back().has_value();
    r.target = std::move(t);
    s.results.push_back(std::move(r));
  }
  s.capture_native(0);
}

HangVerdict judge_hang(const std::vector<int64_t>& suspects,
                       const std::vector<HangInvestigation::Result>& results) {
  HangVerdict v;
  if (suspects.empty()) return v;
  std::vector<HangFinding> findings;
  for (int64_t local_rank : suspects) {
    HangFinding f;
    for (const auto& r : results) {
      if (r.target.local_rank == local_rank) f = r.finding;
    }
    findings.push_back(f);
  }
  size_t root = pick_hang_root(findings).value_or(0);
  v.root = suspects[root];
  v.root_finding = findings[root];
  const HangInvestigation::Result* root_result = nullptr;
  for (const auto& r : results) {
    const HangFinding& f = r.finding;
    bool silent =
        std::find(suspects.begin(), suspects.end(), r.target.local_rank) != suspects.end();
    std::string what = f.in_collective   ? "waits in a collective"
                       : f.where.empty() ? "no stack was read"
                                         : "is not in a collective";
    v.log.push_back(fmt::format(
        "local rank {} (rank {}, {}): {}{}{}; stacks in {}/stack.txt{}", r.target.local_rank,
        r.target.global_rank, silent ? "silent" : "beating", what, f.where.empty() ? "" : ": ",
        f.where, r.target.log_dir, r.python_requested ? " and py_stack.txt" : ""));
    if (r.target.local_rank == v.root) root_result = &r;
  }
  // Every silent rank here waits for a peer: the stuck one may be on another node, and the
  // agent asks the others (hang_exchange.h) before it settles on this one.
  const bool all_wait = v.root_finding.in_collective && !v.root_finding.stopped;
  std::string line =
      all_wait ? fmt::format("every silent rank here waits in a collective (the stuck rank may "
                             "be on another node); naming local rank {} for now",
                             v.root)
               : fmt::format("root cause of the hang: local rank {}", v.root);
  if (root_result) {
    line +=
        fmt::format(" (rank {}, pid {})", root_result->target.global_rank, root_result->target.pid);
  }
  if (!v.root_finding.where.empty()) line += ", stuck in " + v.root_finding.where;
  v.log.push_back(line);
  std::string stack = v.root_finding.python_stack;
  if (!stack.empty()) {
    if (stack.back() == '\n') stack.pop_back();
    v.log.push_back("Python stack of the root cause (main thread, most recent call first):\n" +
                    stack);
  }
  return v;
}

void HangInvestigation::cancel() {
  ++impl_->run;
  impl_->capture.cancel();
  impl_->timer.cancel();
}

}  // namespace dlaunch
