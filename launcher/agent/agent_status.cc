#include "launcher/agent/agent_status.h"

#include <fmt/format.h>
#include <unistd.h>

#include "common/log.h"
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
  NodeStatus s;
  s.run_id = agent_.cfg.run_id;
  s.host = agent_.opts.host;
  s.local_addr = agent_.cfg.local_addr;
  s.agent_pid = static_cast<int>(::getpid());
  s.phase = agent_phase_name(agent_.state().phase);
  if (agent_.state().phase == AgentPhase::kRendezvous && agent_.opts.rendezvous) {
    s.rendezvous_joined = agent_.opts.rendezvous->joined_so_far();
  }
  s.attempt = agent_.state().generation;
  s.max_restarts = agent_.cfg.max_restarts;
  s.restarts = agent_.state().restart_count();
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
  Event e{action == ControlAction::kStop ? Event::Kind::kControlStop
                                         : Event::Kind::kControlRestart};
  e.text = who;
  for (const Action& a : agent_.post(e)) {
    if (a.kind == Action::Kind::kAnswer) return {a.code, agent_.opts.host + ": " + a.text};
  }
  return {500, agent_.opts.host + ": the agent gave no answer"};
}

}  // namespace dlaunch
