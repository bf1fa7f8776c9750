#include "launcher/hang/stack_capture_run.h"

#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fstream>
#include <memory>

#include "common/log.h"

namespace dlaunch {

struct StackCaptureRun::Impl {
  Impl(ProcessContext& p, boost::asio::io_context& io) : procs(p), timer(io) {}
  ProcessContext& procs;
  boost::asio::steady_timer timer;
};

StackCaptureRun::StackCaptureRun(ProcessContext& procs, boost::asio::io_context& io)
    : impl_(std::make_unique<Impl>(procs, io)) {}

StackCaptureRun::~StackCaptureRun() = default;

void StackCaptureRun::start(SpawnRequest req, const std::string& out_path, Duration timeout,
                            Callbacks cb) {
  auto text = std::make_shared<std::string>();
  ProcessCallbacks pcb;
  pcb.on_output = [text](int, std::string_view bytes) {
    if (text->size() < (1u << 20)) text->append(bytes);
  };
  pcb.on_exec_failed = [this, on_failed = cb.on_failed](const std::string& message) {
    cancel();
    on_failed(message);
  };
  pcb.on_exit = [this, text, out_path, on_done = cb.on_done](const ExitStatus& st) {
    cancel();
    std::ofstream(out_path) << *text;
    on_done(st, *text);
  };
  int pid = impl_->procs.spawn(req, std::move(pcb));
  impl_->timer.expires_after(timeout);
  impl_->timer.async_wait([this, pid, timeout](const boost::system::error_code& ec) {
    if (ec) return;
    log_warning("stack capture did not finish within {:.0f} s; killing it", to_seconds(timeout));
    impl_->procs.signal_group(pid, SIGKILL);
  });
}

void StackCaptureRun::cancel() {
  impl_->timer.cancel();
}

}  // namespace dlaunch
