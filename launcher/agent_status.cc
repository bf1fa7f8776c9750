#include "launcher/agent_status.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <boost/asio/post.hpp>

#include "common/log.h"
#include "launcher/agent_core.h"
#include "rendezvous/tcp/tcp_store_server.h"

namespace dlaunch {

void AgentStatus::start_monitor() {
  AgentCore& a = agent_;
  MonitorOptions m = monitor_options(a.cfg, a.opts);
  a.monitor = std::make_unique<AgentMonitor>(a.procs, a.io, m);
  a.monitor->open_timeline(a.files.path());
  if (a.opts.store_server) {
    a.monitor->events().emit("store_hosted",
                             {{"address", fmt::format("{}:{}", a.opts.store_server->host(),
                                                      a.opts.store_server->port())}});
  }
  MonitorHooks hooks;
  hooks.snapshot = [this]() { return snapshot(); };
  hooks.control = [this](ControlAction action, const std::string& who) {
    return on_control(action, who);
  };
  a.monitor->start_endpoint(std::move(hooks));
  if (a.opts.store_server) a.monitor->publish_local(*a.opts.store_server);
}

NodeStatus AgentStatus::snapshot() const {
  const AgentCore& a = agent_;
  NodeStatus s;
  s.run_id = a.cfg.run_id;
  s.host = a.opts.host;
  s.local_addr = a.cfg.local_addr;
  s.agent_pid = static_cast<int>(::getpid());
  s.phase = agent_phase_name(a.phase);
  if (a.phase == AgentPhase::kRendezvous && a.opts.rendezvous) {
    s.rendezvous_joined = a.opts.rendezvous->joined_so_far();
  }
  s.attempt = a.generation;
  s.max_restarts = a.cfg.max_restarts;
  s.restarts = a.restart_count();
  if (a.last_round) {
    s.round = a.last_round->round;
    s.node_rank = a.last_round->group_rank;
    s.nnodes = a.last_round->group_world_size;
    for (int64_t n : a.last_round->local_world_sizes) s.world_size += n;
  }
  s.agent_start_time = std::chrono::duration<double>(a.started_wall.time_since_epoch()).count();
  s.events_file = a.monitor->events().path();
  s.agent_usage = read_proc_usage(s.agent_pid);
  if (a.group) {
    TimePoint now = a.opts.clock->now();
    for (const auto& w : a.group->workers()) {
      s.workers.push_back(worker_status(w, s.restarts, now, a.opts.last_beat(w.heartbeat_file)));
    }
  }
  if (a.opts.store_server) s.store = a.opts.store_server->stats();
  return s;
}

ControlAnswer AgentStatus::on_control(ControlAction action, const std::string& who) {
  AgentCore& a = agent_;
  if (action != ControlAction::kStop) return restart(who);
  if (a.phase == AgentPhase::kDone) return {409, a.opts.host + ": the job is already over"};
  // After the answer is on its way: stopping may end the loop at once (no worker left, a
  // rendezvous round pending), and then the answer would never be written.
  boost::asio::post(a.io, [this, who]() { agent_.signals.on_signal(SIGTERM, who); });
  return {200, fmt::format("{}: stopping (as on SIGTERM; dlaunch exits {})", a.opts.host,
                           exit_codes::kSignalBase + SIGTERM)};
}

ControlAnswer AgentStatus::restart(const std::string& who) {
  AgentCore& a = agent_;
  if (a.phase != AgentPhase::kRunning && a.phase != AgentPhase::kCapturing) {
    return {409, fmt::format("{}: not restarting: the workers are not running (phase {})",
                             a.opts.host, agent_phase_name(a.phase))};
  }
  int64_t used = a.restart_count();
  if (used >= a.cfg.max_restarts) {
    return {409, fmt::format("{}: not restarting: the restart budget is spent ({} of "
                             "--max_restarts {}); a restart would end the job",
                             a.opts.host, used, a.cfg.max_restarts)};
  }
  std::string reason = "restart requested by " + who;
  log_warning("{}; restarting the worker group (counted against --max_restarts)", reason);
  a.group->on_stop_requested(reason);
  a.cause.record(StopKind::kPeerRestart);
  if (a.opts.rendezvous) a.rendezvous.report_to_peers(reason);
  a.phase = AgentPhase::kRunning;  // a capture in progress is abandoned
  a.stop_group(SIGTERM);
  return {200, fmt::format("{}: restarting the worker groups job-wide ({} of {} restarts)",
                           a.opts.host, used + 1, a.cfg.max_restarts)};
}

}  // namespace dlaunch
