// rdzv_sim's simulated PyTorch workers: the store requests one rank of PyTorch 2.15 makes in
// `init_process_group("nccl")` (docs/store_protocol.md, "What PyTorch workers ask the store":
// the default nccl2 backend, with NCCL's scalable init past 128 ranks), sent for real over the
// worker's own TCP store connection (`--store_proxy off`: each worker talks to the job's store
// directly, as under torchrun and dlaunch today). What is simulated: the worker process (it is
// a fiber of an agent process) and the CUDA/NCCL work between the requests (none); what is
// real: the connection, every request and reply on the wire, and the store host serving them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/store/store.h"

namespace dlaunch::sim {

// The keys of one job's init (the default group's NCCL unique ids), as they reach the store.
struct NcclInitModel {
  int64_t world = 0;
  int64_t ranks_per_root = 128;  // TORCH_NCCL_RANKS_PER_ROOT's default

  // How many unique ids (roots) a job of `world` ranks makes: 1 up to ranks_per_root ranks.
  int64_t roots() const;
  // The root that sets id `i`, and the key it sets.
  int64_t root_rank(int64_t i) const { return i * ranks_per_root; }
  std::string id_key(int64_t i) const;
  // Every id key (what each rank waits on and fetches).
  std::vector<std::string> id_keys() const;
};

// One worker's init: PING and `ADD init/ 1` (TCPStore's connect, after the VALIDATE the client
// sends), then a root rank SETs its 128-byte id, and every rank WAITs on all ids, WAITs again and
// MULTI_GETs them. Throws what the store throws; checks each fetched id's size.
void run_worker_init(Store& store, const NcclInitModel& model, int64_t rank);

}  // namespace dlaunch::sim
