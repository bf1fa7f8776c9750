// --rdzv_backend etcd --rdzv_endpoint host:2379: the c10d-style elastic rendezvous of
// dynamic_rendezvous.h (the same state machine, so the same semantics: --nnodes MIN:MAX, last
// call, node-rank hints, re-form on node loss, pushed restart/membership/shutdown events),
// run over etcd instead of an agent's TCP store:
//
//   keys         everything of one run under "/dlaunch/<run_id>/" (EtcdStore's prefix), so
//                runs sharing an etcd never meet; `etcdctl del --prefix /dlaunch/<run_id>/`
//                removes a finished run
//   state        changed only by compare-and-swap transactions (EtcdStore::compare_set)
//   arrivals     a per-node join key "joins/<r>/<node>", put in one transaction that also
//                counts the round's join keys (the arrival index); order is create_revision
//                order. No node retries a compare-and-swap to join (etcd_ledger.h)
//   waiting      one watch per node on its round's few control keys ("done", "superseded",
//                the workers' store address) from the revision of its join, and the count
//                read once per slice (the first arrival every last_call_timeout / 5)
//   liveness     a lease per agent (make_lease_liveness): its key "<rdzv>/alive/<node>" lives
//                as long as the agent renews the lease every keep_alive_interval; when the
//                agent dies (SIGKILL, partition), etcd expires the lease after its TTL, the key
//                vanishes, and the neighbour watching it publishes "membership changed". A
//                beat is one lease renewal (not a raft write); the key is put only with a new
//                lease
//   workers      etcd does not speak PyTorch's TCPStore protocol, so after each round the
//                group-rank-0 agent hosts a TcpStoreServer on its advertised host (a free
//                port) and publishes host:port in etcd (round/<r>/workers_store); every node
//                returns that address as MASTER_ADDR/MASTER_PORT
//                (TORCHELASTIC_USE_AGENT_STORE=True, as with c10d)
//
// Lease TTL = keep_alive_interval x keep_alive_max_attempt, at least 2 s (etcd's floor for a
// one-member cluster with default timing). A neighbour seen alive is looked at again when its
// lease could run out (etcd's timetolive of it), and at every keep-alive step (interval / 4)
// from a second before that: a dead node is seen within TTL + interval / 4 of its last renewal,
// plus etcd's own expiry check (every 500 ms).
//
// Blocking, threads and errors: as DynamicRendezvous; plus ConnectionError naming the etcd
// endpoint when etcd cannot be reached, and the TcpStoreServer's errors on group rank 0.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "rendezvous/handlers/liveness.h"
#include "rendezvous/handlers/rendezvous_registry.h"

namespace dlaunch {

class DynamicRendezvous;
class EtcdRoundLedger;
class EtcdStore;
class TcpStoreServer;

// The dynamic rendezvous over etcd, plus the workers' TCP store on group rank 0. Declared here
// (make_etcd_rendezvous() is what dlaunch uses) so that a driver of many handlers in one process
// (bench/rendezvous/rdzv_sim.cc) can tick their keep-alives itself, as it does for the c10d
// handler: drive_keep_alive_externally() and keep_alive_step() are DynamicRendezvous's.
class EtcdRendezvous final : public RendezvousHandler {
 public:
  // Connects to etcd at once (ConnectionError naming it); UsageError without an endpoint.
  explicit EtcdRendezvous(const RendezvousParams& params);
  ~EtcdRendezvous() override;

  std::string backend() const override { return "etcd"; }
  std::string run_id() const override { return run_id_; }
  RendezvousResult next_rendezvous() override;
  void watch(std::function<void(const RendezvousEvent&)> on_event) override;
  void prepare_watch() override;
  void request_restart(const std::string& report) override;
  FailureVerdict settle_failure() override;
  void begin_leaving() override;
  int64_t num_nodes_waiting() override;
  void mark_finished() override;
  std::string joined_so_far() const override;
  void set_closed() override;
  bool is_closed() override;
  void shutdown() override;

  // See DynamicRendezvous: no keep-alive thread; the caller steps it every interval / 4.
  void drive_keep_alive_externally();
  bool keep_alive_step();

 private:
  std::string run_id_;
  std::string host_;
  RendezvousConfig config_;
  std::optional<std::string> token_;
  std::shared_ptr<EtcdStore> store_;
  std::shared_ptr<EtcdRoundLedger> ledger_;
  std::unique_ptr<DynamicRendezvous> inner_;
  std::mutex mutex_;
  std::unique_ptr<TcpStoreServer> server_;  // guarded by mutex_
};

// The store over run `run_id`'s keys in the etcd at `endpoint` ("/dlaunch/<run_id>/"): what the
// rendezvous runs on, and the base of its result's store (the job's store, under
// "dlaunch/job/<run_id>/"). For readers outside the rendezvous, e.g. `dlaunch status`, which
// finds the agents' status endpoints there. Does not connect yet.
std::shared_ptr<EtcdStore> open_etcd_run_store(const std::string& endpoint,
                                               const std::string& run_id,
                                               Duration request_timeout);

// The etcd backend's factory (etcd_backend.h).
std::unique_ptr<RendezvousHandler> make_etcd_rendezvous(const RendezvousParams& params);

// Lease-based liveness for the dynamic rendezvous (a LivenessFactory). `store` must be an
// EtcdStore (throws UsageError otherwise). The lease is granted at the first beat(), so an
// observer that only calls dead() holds none. beat() renews it, and grants a new one when etcd
// already expired it (the node was declared dead meanwhile; it rejoins at the next round).
std::unique_ptr<Liveness> make_lease_liveness(std::shared_ptr<Store> store,
                                              const std::string& prefix, const std::string& self_id,
                                              Duration window, const Clock& clock);

// The TTL used for `window`: ceil(window) seconds, at least 2.
int64_t lease_ttl_seconds(Duration window);

}  // namespace dlaunch
