// Rendezvous: how the agents of one job meet, agree on node ranks and the worker world, and
// re-form when membership changes. One interface, chosen by --rdzv_backend through a registry
// (static, c10d, etcd). Modelled on torch.distributed.elastic's RendezvousHandler.
//
// Threading: next_rendezvous() blocks the calling thread (the agent calls it between worker
// generations, when no worker runs). Everything else is non-blocking or bounded by the
// keep-alive interval, and safe from any thread; events are delivered on a handler-owned
// thread through the callback given to watch(), and the agent posts them to its event loop.
//
// Errors: TimeoutError (join timeout passed without enough nodes), StateError (the rendezvous
// was closed), NodeMismatchError (this node's rank/run id/node count conflicts with the
// others': the message names the hosts and values), ConnectionError (the store endpoint never
// answered).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "rendezvous/store/store.h"

namespace dlaunch {

// next_rendezvous() of a node that waited for a place in a full job when that job finished
// normally (mark_finished()): not a failure, nothing left to do; the message says so.
class JobFinishedError : public StateError {
 public:
  using StateError::StateError;
};

// next_rendezvous() when the nodes' own settings disagree: another --nnodes, another run id on
// the same store, a node rank claimed by two agents. Starting the nodes again with the same
// settings meets the same conflict, so the agent exits with a code that says "do not retry"
// (exit_codes::kNodeMismatch).
class NodeMismatchError : public StateError {
 public:
  using StateError::StateError;
};

class TcpStoreServer;

// What one completed round agreed on.
struct RendezvousResult {
  int64_t round = 0;             // increases by one per completed round, job-wide
  int64_t group_rank = 0;        // this node's rank (GROUP_RANK)
  int64_t group_world_size = 1;  // nodes in this round (GROUP_WORLD_SIZE)
  // Workers per node, indexed by group rank (nproc may differ per node). This node's global
  // ranks are [sum(local_world_sizes[0..group_rank)), + local_world_sizes[group_rank]).
  std::vector<int64_t> local_world_sizes;
  // Hosts per node, indexed by group rank, as the nodes advertised themselves (for messages).
  // Rounds of more than RoundTable::kNodesListedUpTo (64) nodes name only this node and, for
  // c10d, its two keep-alive neighbours (the others are ""): every node reads a fixed amount
  // at any scale (rendezvous/handlers/round_table.h).
  std::vector<std::string> hosts;
  // Where workers reach the job's store (MASTER_ADDR / MASTER_PORT).
  std::string master_addr;
  int64_t master_port = 0;
  // Job-wide count of failure-driven restarts so far (TORCHELASTIC_RESTART_COUNT).
  int64_t restart_count = 0;
  // The job store, already namespaced by run id; the agent hands nothing else to workers.
  std::shared_ptr<Store> store;

  int64_t world_size() const;
  int64_t global_rank_base() const;  // the global rank of this node's local rank 0
};

// Something another node did that the agent must act on while its workers run.
struct RendezvousEvent {
  enum class Kind {
    kMembershipChanged,  // a node joined (wants in) or left (keep-alive lost): re-form, free
    kRestartRequested,   // a worker failed somewhere: restart now, spends the job-wide budget
    kShutdownRequested,  // the job is over (success elsewhere, or closed): stop workers
    // The job's store is gone (c10d: the agent hosting it died or is unreachable for the
    // keep-alive window): no round can form again; stop workers and exit. Local to the node
    // that noticed (every node notices on its own); `reason` is the sentence to print.
    kStoreLost,
  };
  Kind kind;
  // For the log: "node host-b (node rank 3) lost (no keep-alive for 15 s)", ...
  std::string reason;
  // kMembershipChanged: a node of the round died or left (the round's verdict says "lost"), not
  // one asking in. The agent may then keep its workers for an in-process shrink.
  bool node_gone = false;
};

// How a worker failure counts (settle_failure()). Every node of the round gets the same
// answer, so they agree on the job-wide restart count.
struct FailureVerdict {
  enum class Kind {
    kCharged,    // a worker failed and every node answered: the restart spends the budget
    kNodeLost,   // a node of the round died: re-form with the others, free
    kStoreLost,  // the job's store is gone (see RendezvousEvent::Kind::kStoreLost)
  };
  Kind kind = Kind::kCharged;
  std::string reason;  // kNodeLost: "node 10.0.0.3 (node rank 2) lost ...", kStoreLost: the cause
};

class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;

  // "static", "c10d", "etcd".
  virtual std::string backend() const = 0;
  virtual std::string run_id() const = 0;

  // Joins the next round and blocks until it completes (see the threading note above).
  virtual RendezvousResult next_rendezvous() = 0;

  // Delivers events until shutdown(); replaces any earlier callback. May be called once per
  // round, after next_rendezvous().
  virtual void watch(std::function<void(const RendezvousEvent&)> on_event) = 0;
  // Readies what watch() needs (a thread, its store connection) ahead of the round, so that it
  // is not on the path from the round's end to the workers, where every agent released by the
  // round does the same at once. Never blocks, never throws; a failure shows at watch().
  virtual void prepare_watch() {}

  // Tells every node that a worker failed here (first failure wins); `report` is the one-line
  // root cause the other nodes print. Increments the job-wide restart count.
  virtual void request_restart(const std::string& report) = 0;
  // After a worker failure in the current round (here, or a restart event from another node):
  // decides whether it spends the restart budget, or whether a node of the round was lost (its
  // workers' peers fail first, within a second; the keep-alive verdict comes later). Blocks up
  // to the keep-alive window and a little more; call it off the agent's event loop. The first
  // verdict of a round holds for every node. Default (static): charged at once.
  virtual FailureVerdict settle_failure() { return {}; }
  // This node is about to stop while its round runs (a stop signal: Kubernetes deleting its
  // pod, a scale-down). From now on it counts itself in no failure (settle_failure's count of
  // the nodes alive), and it tells the others that it leaves (the round's verdict "left" and a
  // membership event), so the failures its leaving causes in their workers are settled free
  // instead of charged. Call it before its workers get the signal. Never blocks: the telling is
  // done on the handler's own thread; a node killed before that is reported lost by the
  // others' keep-alive. Default (static: no node may leave): nothing.
  virtual void begin_leaving() {}
  // Nodes that asked to join and wait for the next round (elastic scale-up).
  virtual int64_t num_nodes_waiting() = 0;
  // The next next_rendezvous() completes its round as soon as `nodes` nodes (and at least MIN)
  // joined, without the last call: the agent knows who comes back (the running round's nodes
  // that kept their workers after a loss), and waiting for newcomers would only hold those
  // workers; a newcomer joins the round after, as any scale-up. Fewer arrivals than `nodes`
  // (another node lost meanwhile) complete by the last call as usual. Once, then forgotten.
  // Default (a backend without a last call): nothing.
  virtual void expect_nodes(int64_t nodes) { (void)nodes; }
  // After this node passed the exit barrier (every node's workers succeeded): tells the nodes
  // that wait for a place in the full job that it finished, so they exit 0 instead of taking
  // the store's end for its death. Bounded by a few seconds; never throws. Default: nothing.
  virtual void mark_finished() {}
  // Closes the rendezvous for everyone: no more rounds (job finished or failed for good).
  // Bounded by a few seconds when the store is gone.
  virtual void set_closed() = 0;
  virtual bool is_closed() = 0;
  // Leaves the rendezvous cleanly (stops keep-alives, releases leases). Idempotent.
  virtual void shutdown() = 0;

  // The job's store server this agent hosts, when its backend's factory decided it does
  // (RendezvousParams::host_store, store_host.h); null otherwise. The handler keeps it running
  // until the handler is destroyed, after shutdown().
  std::shared_ptr<TcpStoreServer> hosted_store() const { return hosted_store_; }
  void keep_hosted_store(std::shared_ptr<TcpStoreServer> server) { hosted_store_ = std::move(server); }

  // While next_rendezvous() waits: what it last saw of its round ("1 of --nnodes 2:3 nodes
  // joined round 0"); empty when it saw nothing yet or does not wait. Never blocks: for the
  // status endpoint, from any thread.
  virtual std::string joined_so_far() const {
    std::lock_guard<std::mutex> lock(joined_mutex_);
    return joined_;
  }

 protected:
  void note_joined(std::string text) {
    std::lock_guard<std::mutex> lock(joined_mutex_);
    joined_ = std::move(text);
  }

 private:
  std::shared_ptr<TcpStoreServer> hosted_store_;
  mutable std::mutex joined_mutex_;
  std::string joined_;
};

}  // namespace dlaunch
