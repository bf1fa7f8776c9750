// Creating rendezvous handlers: the parameters every backend gets, the --rdzv_conf options, and
// a registry from --rdzv_backend names ("static", "c10d", "etcd") to backend descriptors.
//
//   RendezvousParams p;
//   p.backend = "c10d"; p.run_id = "job1"; p.min_nodes = 2; p.max_nodes = 4;
//   p.endpoint = "10.0.0.1:29400"; p.host = "10.0.0.2"; p.local_world_size = 8;
//   auto handler = create_rendezvous_handler(p);   // connects to the store (TcpStoreClient)
//   RendezvousResult r = handler->next_rendezvous();
//
// A backend is a descriptor (RendezvousBackend below): its name, its endpoint's default port
// and checks, who hosts the job's store, and how `dlaunch status` finds a job of it. The rest of
// dlaunch asks the descriptor, never compares backend names. The registry includes no backend:
// the built-in ones register from rendezvous/builtin_backends.cc (one line each), so adding a
// backend is a folder of its own plus one line there (docs/rendezvous.md, "Adding a backend").
//
// Who hosts the job's store is the backend's decision, made in its factory when the agent asks
// (`host_store`, store_host.h): static, node rank 0 on the endpoint; c10d, the agent that binds
// --rdzv_endpoint first; etcd, none. The handler then owns the server (hosted_store()). Without
// `host_store` (tests, benchmarks that run their own server) no server is started.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "rendezvous/handlers/liveness.h"
#include "rendezvous/handlers/rendezvous_handler.h"
#include "rendezvous/store/store.h"

namespace dlaunch {

// --rdzv_conf key=value options, with torchrun's defaults where torchrun has them.
struct RendezvousConfig {
  Duration join_timeout = std::chrono::seconds(600);
  Duration last_call_timeout = std::chrono::seconds(1);
  Duration keep_alive_interval = std::chrono::seconds(5);
  int64_t keep_alive_max_attempt = 3;
  Duration close_timeout = std::chrono::seconds(30);
  std::string token_file;  // job token file (DLAUNCH_JOB_TOKEN wins when set)

  // The keys parse() reads, every backend's.
  static const std::vector<std::string>& keys();
  // Parses the map; throws UsageError naming the key and value on a bad number. Unknown keys
  // are logged and ignored (torchrun passes some we have no use for).
  static RendezvousConfig parse(const std::map<std::string, std::string>& conf);
  // "a=1,b=2" -> map (the --rdzv_conf syntax); throws UsageError on an item without '='.
  static std::map<std::string, std::string> split(const std::string& text);
};

// The join timeout given in `conf` (--rdzv_conf), else the default; reads no other key (so it
// logs nothing about them). Throws UsageError on a malformed value.
Duration join_timeout_in(const std::map<std::string, std::string>& conf);

struct RendezvousParams {
  std::string backend = "static";
  std::string run_id = "none";
  int64_t min_nodes = 1;
  int64_t max_nodes = 1;
  // The store's "host:port" ("[v6]:port" works): --master_addr:--master_port for static,
  // --rdzv_endpoint for c10d. Used to connect when `store` is null, and as MASTER_ADDR/PORT.
  std::string endpoint;
  std::optional<int64_t> node_rank;  // --node_rank or SLURM_NODEID: required for static
  int64_t local_world_size = 1;
  std::string host;  // this node's address as others should see it (messages, rank table)
  std::map<std::string, std::string> config;  // --rdzv_conf
  // The job token for the store connections this handler opens (nullopt: none).
  std::optional<std::string> token;
  // This agent's build, "0.1.0+3467aab", published at rendezvous so agents of one job running
  // different builds warn (version_mix.h). Empty: publish nothing, check nothing.
  std::string version;
  // A store to use instead of connecting to `endpoint`. The handler's background threads (event
  // watcher, keep-alive) need their own connections: `open_store` makes one; when null they
  // connect to `endpoint` themselves, or share `store` when there is no endpoint (in-memory).
  std::shared_ptr<Store> store;
  std::function<std::shared_ptr<Store>()> open_store;
  // Liveness backend for the dynamic handler (keep-alive heartbeats); null: heartbeats through
  // the store (make_store_liveness). The etcd backend plugs leases in here.
  LivenessFactory liveness;
  // The clock for timeouts and keep-alives (tests pass a fake one); null: the real clock.
  const Clock* clock = nullptr;
  // This agent hosts the job's store if its backend says so (see the top of this file); an
  // endpoint with port 0 (c10d) then becomes the port the server got.
  bool host_store = false;
};

using RendezvousFactory =
    std::function<std::unique_ptr<RendezvousHandler>(const RendezvousParams&)>;

// Who hosts the job's TCP store, where the agents meet (store_host.h).
enum class StoreHosting {
  kNodeRankZero,  // the agent of node rank 0, on the endpoint (static: --master_addr/--master_port)
  kFirstToBind,   // whichever agent binds --rdzv_endpoint first (c10d, torchrun's rule)
  kNone,          // no agent: the rendezvous is kept elsewhere (etcd)
};

// The launch flags a backend reads to check and resolve its endpoint.
struct BackendFlags {
  std::string endpoint;  // --rdzv_endpoint as given; "" when not
  std::string master_addr;
  int64_t master_port = 0;              // 0: a free port
  std::string master_port_what = "--master_port";  // how the port was given, for messages
  int64_t min_nodes = 1;
  int64_t max_nodes = 1;
  int64_t node_rank = 0;
  bool node_rank_given = false;
};

// What --rdzv_backend NAME means, for everything outside the backend's own folder.
struct RendezvousBackend {
  std::string name;
  // Names of torchrun's backends that this one stands in for without speaking them, each with
  // the sentence that says so after "--rdzv_backend='NAME' " (etcd: "etcd-v2").
  std::map<std::string, std::string> declined_names;
  // The port of an --rdzv_endpoint that names none.
  uint16_t default_port = 0;
  StoreHosting store_hosting = StoreHosting::kNone;
  // Takes an elastic node range (--nnodes MIN:MAX).
  bool elastic = true;
  // Node ranks are --node_rank, 0 to nnodes-1, rather than the order in which agents arrive.
  bool node_rank_required = false;
  // A one-node job needs no rendezvous: its agent hosts the store at --master_addr:--master_port
  // (static; nobody else can join, so there is nobody to meet).
  bool one_node_without_rendezvous = false;
  // --rdzv_conf keys of torchrun's backend of this name that dlaunch has no use for: accepted,
  // so that torchrun command lines work, and ignored. Every backend reads
  // RendezvousConfig::keys().
  std::vector<std::string> ignored_conf_keys;

  // Throws UsageError when the flags cannot work, before anything starts (--dry_run too). Null:
  // nothing to check.
  std::function<void(const BackendFlags&)> check_flags;
  // RendezvousParams::endpoint from flags that check_flags accepted.
  std::function<std::string(const BackendFlags&)> resolve_endpoint;
  // Returns a problem worth refusing the launch for that a look outside can see and the flags
  // cannot (etcd: no member's host name resolves); nullopt: none. Null: no look.
  std::function<std::optional<std::string>(const BackendFlags&)> preflight;
  RendezvousFactory create;

  // `dlaunch status|stop|restart|dump`: opens the store of run `run_id` where the agents
  // published their status (the job control prefixes the job's keys) and sets `where` to a
  // description for messages. Null: the job's TCP store at the endpoint or master address,
  // which job control finds without being told the backend.
  std::function<std::shared_ptr<Store>(const std::string& endpoint, const std::string& run_id,
                                       Duration timeout, std::string& where)>
      open_job_store;
  // With open_job_store: what --rdzv_endpoint is, for job control's message when it is missing
  // ("etcd's client URL (or its members' list) as the job was given it (e.g. 10.0.0.5:2379)").
  std::string job_endpoint_hint;
};

// Adds a backend, or replaces the one of its name. Thread-safe.
void register_rendezvous_backend(RendezvousBackend backend);
// The backend registered as `name`; null when there is none. Thread-safe; the descriptor stays
// valid while the process runs (a replaced one too).
std::shared_ptr<const RendezvousBackend> find_rendezvous_backend(const std::string& name);
// The registered names, in the order of registration (static, c10d, etcd, then others).
std::vector<std::string> rendezvous_backend_names();
// The sentence of the backend that declines `name` (RendezvousBackend::declined_names).
std::optional<std::string> declined_rendezvous_backend(const std::string& name);
// Every backend's RendezvousBackend::ignored_conf_keys.
std::vector<std::string> ignored_rendezvous_conf_keys();
// static, c10d and etcd, in that order. Defined in rendezvous/builtin_backends.cc and read once
// by the registry itself before its first use. Not a static registrar object in each backend's
// file: the linker drops an object file of a static library that nothing references, so such a
// backend would be missing from some binaries, and the order of static initialisers across
// files is unspecified. The registry's reference to this function links them all.
std::vector<RendezvousBackend> builtin_rendezvous_backends();

// The handler for params.backend; throws UsageError for an unknown backend or invalid params,
// ConnectionError when the store endpoint cannot be reached within the join timeout.
std::unique_ptr<RendezvousHandler> create_rendezvous_handler(const RendezvousParams& params);

namespace detail {
// How long a TCP store client of the rendezvous tries to connect again after it lost a
// connection that worked (per attempt of a background thread, likewise).
inline constexpr Duration kStoreReconnectTimeout = std::chrono::seconds(2);
// The store a handler uses, connecting to params.endpoint if needed (shared by backends).
// Connecting gives up after the join timeout.
std::shared_ptr<Store> connect_store(const RendezvousParams& params, const RendezvousConfig& config);
// A fresh connection for a background thread (see RendezvousParams::open_store). It connects
// at its first call (so interrupt() can end the connect) within kStoreReconnectTimeout, and its
// replies are bounded by the keep-alive window (at least 5 s), not the join timeout: the
// threads are joined by shutdown(), which must stay quick when the store host is gone.
std::function<std::shared_ptr<Store>()> store_opener(const RendezvousParams& params,
                                                     const RendezvousConfig& config,
                                                     std::shared_ptr<Store> main_store);
// A node id unique to this agent process: "<host>-<pid>-<random>".
std::string make_node_id(const std::string& host);
}  // namespace detail

}  // namespace dlaunch
