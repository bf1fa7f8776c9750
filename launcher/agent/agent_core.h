// The agent: its shared context (agent_context.h), the parts that each do one job over it, and
// post(), which runs the lifecycle's step() (agent_step.h) and hands each action to the part
// that carries it out (agent.h says what the agent does as a whole):
//
//   agent_rendezvous.h  the rendezvous loop: rounds, pushed events, failure verdicts, reports
//   agent_workers.h     starting a generation's workers and seeing them exit
//   agent_hangs.h       heartbeat checks, stacks and the diagnosis of hung workers
//   agent_stopping.h    stopping the group: grace, SIGKILL, what the workers left behind
//   agent_signals.h     the signals dlaunch receives
//   agent_status.h      the status endpoint and control requests (agent_monitor.h)
//
// The parts know the context, not the core or each other: what one needs from another is an
// action of step(). Everything runs on the loop thread; helper threads come back through `gate`.
#pragma once

#include <string>
#include <vector>

#include "launcher/agent/agent_context.h"
#include "launcher/agent/agent_hangs.h"
#include "launcher/agent/agent_rendezvous.h"
#include "launcher/agent/agent_signals.h"
#include "launcher/agent/agent_status.h"
#include "launcher/agent/agent_stopping.h"
#include "launcher/agent/agent_workers.h"

namespace dlaunch {

class AgentCore : public AgentContext {
 public:
  AgentCore(LaunchConfig c, ProcessContext& p, boost::asio::io_context& i, AgentOptions o);
  // The monitor goes first: its hooks call into the parts.
  ~AgentCore() override { monitor.reset(); }

  // Run directory, monitor, OMP threads, ports, signals; before the first generation.
  void prepare();
  std::vector<Action> post(const Event& e) override;
  // The agent cannot go on (an unexpected error escaped a handler): nothing may outlive it.
  void emergency_stop();
  // The agent is being destroyed: helper threads still blocked are let go.
  void detach_threads() { rendezvous_.detach_threads(); }

 private:
  RendezvousLoop rendezvous_;
  WorkerSupervisor workers_;
  HangWatch hangs_;
  GroupStopper stopper_;
  AgentSignals signals_;
  AgentStatus status_;

  void carry_out(const Action& a);
  // The log lines, timeline entries and answers step() words itself.
  void say(const Action& a);
  void replace_rank(const Action& a);
  void announce_restart();
  void rendezvous_keeping_workers();
  void shrink(const Action& a);
  void stop_group(int first);
  void collect_group();
  void say_why_finished(const Action& a);
  void record_restart(const Action& a);
  void report_failure(int64_t restart_count);
  void start_exit_barrier();
  void finish_now(int code);
  void stop_loop();
};

}  // namespace dlaunch
