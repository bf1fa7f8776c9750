// Joins the job's process group. A world of one gets the local (no-op) group without touching
// the network; otherwise the worker connects to the agent's store at MASTER_ADDR:MASTER_PORT
// (with the job token when one is configured), namespaces its keys per restart attempt
// ("dtrain/attempt_<n>/..." so a restarted group never reads a dead attempt's addresses) and
// builds the gloo group through it.
//
// Blocks until every rank joined or the timeout passes (TimeoutError); a missing store throws
// ConnectionError naming the address.
#pragma once

#include <chrono>
#include <memory>

#include "common/worker_env.h"
#include "worker/comm/process_group.h"

namespace dlaunch::train {

std::unique_ptr<comm::ProcessGroup> join_process_group(const WorkerEnv& env,
                                                       std::chrono::seconds timeout);

}  // namespace dlaunch::train
