// Workers' keys in a dlaunch TCP store live in a namespace of their rendezvous round.
//
// Why: an elastic job keeps one store across rounds, and a membership change keeps
// TORCHELASTIC_RESTART_COUNT (hence PyTorch's "/worker/attempt_<n>/" and dtrain's
// "dtrain/attempt_<n>/" prefixes, spelled "//worker/..." on the wire by PyTorch 1.13), so a new
// round's workers read the previous round's addresses. PyTorch 2.x's workers put no restart
// count in their keys at all (torchrun 2.x gives each restart a store of its own), so a failure
// restart, a new round of the same store, needs it as much. Deleting known prefixes missed
// spellings; a namespace per round cannot.
//
// How: the node that completes a round calls begin_worker_namespace() before it releases any
// node, so every worker of the round connects after it. The server gives each connection that
// did not declare itself an agent's (PyTorch's, dtrain's) the namespace current at its first key
// operation and prepends it to every key it sends. Agents' connections
// (TcpStoreClientOptions::agent) see the store unscoped. Static, c10d and etcd rounds set one,
// and a one-node job's agent, which has no rounds, sets one per attempt
// (TcpStoreServer::begin_worker_namespace_local). Without a namespace set (a store used outside
// dlaunch) nothing is prepended. One job per store: the namespace is store-wide, so the server
// refuses agents of another run (TcpStoreServerOptions::run_id), whose workers would otherwise
// take this run's namespace or give theirs to this run's workers.
#pragma once

#include <cstdint>
#include <string>

namespace dlaunch {

class Store;

inline constexpr char kWorkerNamespaceKey[] = "dlaunch/worker_namespace";

// "dlaunch/workers/<run_id>/round_<round>/".
std::string worker_namespace(const std::string& run_id, int64_t round);

// Deletes the keys of the namespace in force, then makes `ns` the one new worker connections
// get. Only a store that can delete by prefix (Store::can_delete_prefix: a dlaunch TCP store)
// hosts worker namespaces: on any other store this does nothing and returns false. Blocks for
// three store round trips; throws what the store throws.
bool begin_worker_namespace(Store& store, const std::string& ns);

}  // namespace dlaunch
