#include "launcher/agent/agent_status.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <boost/asio/post.hpp>

#include "common/log.h"
#include "launcher/agent/agent_core.h"
#include "rendezvous/tcp/tcp_store_server.h"

namespace dlaunch {

void AgentStatus::start_monitor() {
  MonitorOptions m = monitor_options(agent_.cfg, agent_.opts);
  agent_.monitor = std::make_unique<AgentMonitor>(agent_.procs, agent_.io, m);
  agent_.monitor->open_timeline(agent_.files.path());
  if (agent_.opts.store_server) {
    agent_.monitor->events().emit("store_hosted",
                             {{"address", fmt::format("{}:{}", agent_.opts.store_server->host(),
                                                      agent_.opts.store_server->port())}});
  }
  MonitorHooks hooks;
  hooks.snapshot = [this]() { return snapshot(); };
  hooks.control = [this](ControlAction action, const std::string& who) {
    return on_control(action, who);
  };
  agent_.monitor->start_endpoint(std::move(hooks));
  if (agent_.opts.store_server) agent_.monitor->publish_local(*agent_.opts.store_server);
}

NodeStatus AgentStatus::snapshot() const {
  const AgentCore& a = agent_;
  NodeStatus s;
  s.run_id = agent_.cfg.run_id;
  s.host = agent_.opts.host;
  s.local_addr = agent_.cfg.local_addr;
  s.agent_pid = static_cast<int>(::getpid());
  s.phase = agent_phase_name(agent_.phase);
  if (agent_.phase == AgentPhase::kRendezvous && agent_.opts.rendezvous) {
    s.rendezvous_joined = agent_.opts.rendezvous->joined_so_far();
  }
  s.attempt = agent_.generation;
  s.max_restarts = agent_.cfg.max_restarts;
  s.restarts = agent_.restart_count();
  if (agent_.last_round) {
    s.round = agent_.last_round->round;
    s.node_rank = agent_.last_round->group_rank;
    s.nnodes = agent_.last_round->group_world_size;
    for (int64_t n : agent_.last_round->local_world_sizes) s.world_size += n;
  }
  s.agent_start_time =
      std::chrono::duration<double>(agent_.started_wall.time_since_epoch()).count();
  s.events_file = agent_.monitor->events().path();
  s.agent_usage = read_proc_usage(s.agent_pid);
  if (agent_.group) {
    TimePoint now = agent_.opts.clock->now();
    for (const auto& w : agent_.group->workers()) {
      s.workers.push_back(
          worker_status(w, s.restarts, now, agent_.opts.last_beat(w.heartbeat_file)));
    }
  }
  if (agent_.opts.store_server) s.store = agent_.opts.store_server->stats();
  return s;
}

ControlAnswer AgentStatus::on_control(ControlAction action, const std::string& who) {
  if (action != ControlAction::kStop) return restart(who);
  if (agent_.phase == AgentPhase::kDone)
    return {409, agent_.opts.host + ": the job is already over"};
  // After the answer is on its way: stopping may end the loop at once (no worker left, a
  // rendezvous round pending), and then the answer would never be written.
  boost::asio::post(agent_.io, [this, who]() { agent_.signals.on_signal(SIGTERM, who); });
  return {200, fmt::format("{}: stopping (as on SIGTERM; dlaunch exits {})", agent_.opts.host,
                           exit_codes::kSignalBase + SIGTERM)};
}

ControlAnswer AgentStatus::restart(const std::string& who) {
  if (agent_.phase != AgentPhase::kRunning && agent_.phase != AgentPhase::kCapturing) {
    return {409, fmt::format("{}: not restarting: the workers are not running (phase {})",
                             agent_.opts.host, agent_phase_name(agent_.phase))};
  }
  int64_t used = agent_.restart_count();
  if (used >= agent_.cfg.max_restarts) {
    return {409, fmt::format("{}: not restarting: the restart budget is spent ({} of "
                             "--max_restarts {}); a restart would end the job",
                             agent_.opts.host, used, agent_.cfg.max_restarts)};
  }
  std::string reason = "restart requested by " + who;
  log_warning("{}; restarting the worker group (counted against --max_restarts)", reason);
  agent_.group->on_stop_requested(reason);
  agent_.cause.record(StopKind::kPeerRestart);
  if (agent_.opts.rendezvous) agent_.rendezvous.report_to_peers(reason);
  agent_.phase = AgentPhase::kRunning;  // a capture in progress is abandoned
  agent_.stop_group(SIGTERM);
  return {200, fmt::format("{}: restarting the worker groups job-wide ({} of {} restarts)",
                           agent_.opts.host, used + 1, agent_.cfg.max_restarts)};
}

}  // namespace dlaunch
