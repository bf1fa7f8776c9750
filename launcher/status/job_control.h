// `dlaunch status|stop|restart|dump`: the job-wide view and control, from any machine that
// reaches the job's store. The agents publish their status endpoints in the store
// (agent_monitor.h); these commands read the list from there and talk to each agent over HTTP,
// all agents at once.
//
//   dlaunch status  [--json] [--events]   a table of every node and worker (or JSON); --events
//                                          merges every node's timeline, ordered by time
//   dlaunch stop                           every agent stops as on SIGTERM (each exits 143)
//   dlaunch restart                        one agent restarts the worker groups job-wide (the
//                                          path of a failure: counted against --max_restarts;
//                                          refused when the budget is spent)
//   dlaunch dump                           every worker's stacks on every node, now, into each
//                                          agent's run directory; prints where
// Where the job is: --rdzv_endpoint HOST[:PORT] (c10d, default port 29400) or --master_addr /
// --master_port (static and single-node jobs), and --rdzv_id (the run id), each also from its
// DLAUNCH_* twin; the job token from DLAUNCH_JOB_TOKEN or --token_file (or --rdzv_conf
// token_file=PATH), as the agents take it.
//
// Exit codes: 0 every agent answered (and accepted), 1 an agent was unreachable or refused, 2
// bad usage or the store could not be reached. Output goes to stdout, problems to stderr.
#pragma once

#include <string>
#include <vector>

#include "launcher/config/control_commands.h"

namespace dlaunch {

// `args`: argv[1..], starting with the subcommand. Never throws.
int run_job_control(const std::vector<std::string>& args);

}  // namespace dlaunch
