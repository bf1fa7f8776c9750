#include "launcher/agent/agent.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "common/error.h"
#include "common/log.h"
#include "launcher/agent/agent_core.h"

extern char** environ;

namespace dlaunch {
namespace asio = boost::asio;

std::vector<std::pair<std::string, std::string>> current_environment() {
  std::vector<std::pair<std::string, std::string>> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

struct Agent::Impl : AgentCore {
  using AgentCore::AgentCore;
};

Agent::Agent(LaunchConfig cfg, ProcessContext& procs, asio::io_context& io, AgentOptions opts)
    : impl_(std::make_unique<Impl>(std::move(cfg), procs, io, std::move(opts))) {}

Agent::~Agent() {
  impl_->gate->close();
  impl_->detach_threads();
}

int Agent::run() {
  try {
    // The loop must not run dry while a helper thread (rendezvous round, exit barrier) works:
    // only the end of the job stops it, with io.stop().
    auto work = asio::make_work_guard(impl_->io);
    impl_->prepare();
    impl_->post({Event::Kind::kStart});
    impl_->io.run();
  } catch (const UsageError& e) {
    log_error("{}", e.what());
    impl_->emergency_stop();
    return exit_codes::kUsage;
  } catch (const std::exception& e) {
    log_error("{}", e.what());
    impl_->emergency_stop();
    return exit_codes::kWorkersFailed;
  }
  return impl_->state().exit_code;
}

int64_t Agent::restarts_used() const { return impl_->state().restarts_used; }
int64_t Agent::generations() const { return impl_->state().generation + 1; }

}  // namespace dlaunch
