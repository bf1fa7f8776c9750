// The CPU process group: gloo (libgloo-dev) over TCP, bootstrapped through a key-value store.
//
// Construction blocks until every rank has connected (full mesh) or the timeout passes
// (TimeoutError). Two gloo contexts are built: one for the blocking calls of the training thread,
// one for the async bucket allreduces of the communication thread, so the two never share tags
// or sockets and can run at the same time.
//
// Small blocking float/double allreduces (<= ShmAllreduce::kSlotBytes per rank) go through
// shared memory instead when all ranks are on one host (worker/comm/shm_allreduce.h); the async
// allreduce, broadcast, allgather and barrier always use gloo. DLAUNCH_SHM_ALLREDUCE=0 turns the
// shared-memory path off.
//
// Addresses: each rank publishes the address of a TCP device bound to `hostname` (or to the
// interface `iface`, like PyTorch's GLOO_SOCKET_IFNAME). For ranks all on one host, 127.0.0.1.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "worker/comm/process_group.h"

namespace gloo::rendezvous {
class Store;
}

namespace dlaunch {
class Store;
}

namespace dlaunch::comm {

struct GlooOptions {
  std::string hostname = "127.0.0.1";
  std::string iface;  // wins over hostname when set
  // How long a collective (gloo's or the shared-memory all-reduce) waits for its peers before
  // throwing TimeoutError naming it (dtrain's --collective_timeout).
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  // How long connecting the full mesh waits for every rank (0: `timeout`).
  std::chrono::milliseconds connect_timeout{0};
};

// Bootstraps through a gloo store (HashStore/FileStore in tests, or the adapter below). The
// caller namespaces the store per job attempt (a PrefixStore); the store must outlive this call
// only.
std::unique_ptr<ProcessGroup> make_gloo_process_group(gloo::rendezvous::Store& store, int rank,
                                                      int size, const GlooOptions& options);

// Bootstraps through one of our stores (the agent's TCP store in a real job).
std::unique_ptr<ProcessGroup> make_gloo_process_group(dlaunch::Store& store, int rank, int size,
                                                      const GlooOptions& options);

// Whether `pg` is a gloo group whose small allreduces use shared memory (for tests and logs).
bool gloo_uses_shared_memory(const ProcessGroup& pg);

}  // namespace dlaunch::comm
