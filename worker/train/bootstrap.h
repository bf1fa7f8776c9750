// Joins the job's process group. A world of one gets the local (no-op) group without touching
// the network; otherwise the worker connects to the agent's store at MASTER_ADDR:MASTER_PORT
// (with the job token when one is configured), namespaces its keys per restart attempt
// ("dtrain/attempt_<n>/..." so a restarted group never reads a dead attempt's addresses) and
// builds the gloo group through it. A group re-formed after a peer's death (rank-level recovery,
// rank_recovery.h) joins generation g > 0 under "dtrain/attempt_<n>/gen_<g>/...": the broken
// generation's keys are never read again. `client`: the store client to bootstrap through (one
// the caller can interrupt); null: a new one.
//
// Every rank votes through the store (two counters under the attempt prefix): when all ranks
// have a GPU of their own (device.cuda_device >= 0, local workers <= visible GPUs) and the NCCL
// plugin (nccl_plugin.h), they build an NCCL group, its unique ids under the same prefix;
// otherwise (CPU ranks, ranks sharing a GPU, no plugin on some rank) everyone takes gloo, GPU
// ranks staging gradients and SyncBN sums through the host and saying why in the log.
//
// Blocks until every rank joined or join_timeout passes (TimeoutError); a missing store throws
// ConnectionError naming the address. The group's collectives then give up after
// collective_timeout (--collective_timeout): TimeoutError naming the collective.
#pragma once

#include <chrono>
#include <memory>

#include "common/worker_env.h"
#include "kernels/device.h"
#include "rendezvous/store/store.h"
#include "worker/comm/process_group.h"

namespace dlaunch::train {

std::unique_ptr<comm::ProcessGroup> join_process_group(const WorkerEnv& env,
                                                       std::chrono::milliseconds join_timeout,
                                                       std::chrono::milliseconds collective_timeout,
                                                       const kernels::OpenedDevice& device,
                                                       int64_t generation = 0,
                                                       std::shared_ptr<Store> client = nullptr);

// A client of the agent's store at MASTER_ADDR:MASTER_PORT (with the job token when one is
// configured), its calls bounded by `timeout`.
std::shared_ptr<Store> connect_job_store(const WorkerEnv& env, std::chrono::milliseconds timeout);

}  // namespace dlaunch::train
