#include "rendezvous/etcd/etcd_rendezvous.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <unordered_map>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/handlers/dynamic_rendezvous.h"
#include "rendezvous/etcd/etcd_endpoints.h"
#include "rendezvous/etcd/etcd_ledger.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/tcp/host_port.h"
#include "rendezvous/tcp/job_token.h"
#include "rendezvous/tcp/tcp_store_client.h"
#include "rendezvous/tcp/tcp_store_server.h"
#include "rendezvous/tcp/worker_namespace.h"

namespace dlaunch {
namespace {

// Ranges per transaction: two per node (alive, left), under etcd's 128-op limit.
constexpr size_t kNodesPerTxn = 50;

std::shared_ptr<etcd::Client> make_client(const std::string& endpoint) {
  etcd::ClientOptions o;
  o.endpoint = endpoint;
  return std::make_shared<etcd::Client>(o);
}

std::string run_prefix(const std::string& run_id) { return "/dlaunch/" + run_id + "/"; }

class LeaseLiveness final : public Liveness {
 public:
  LeaseLiveness(std::shared_ptr<EtcdStore> store, std::string prefix, std::string self_id,
                Duration window, const Clock& clock)
      : store_(std::move(store)),
        prefix_(std::move(prefix)),
        self_(std::move(self_id)),
        window_(window),
        ttl_(lease_ttl_seconds(window)),
        clock_(clock) {}

  void beat() override {
    auto& client = store_->client();
    if (lease_ != 0 && !client.lease_keepalive(lease_)) {
      log_warning(
          "etcd lease {:x} of node {} had expired (this agent was silent for more than "
          "{} s); taking a new one, the others re-form without this node meanwhile",
          lease_, self_, ttl_);
      lease_ = 0;
    }
    if (lease_ == 0) {
      lease_ = client.lease_grant(ttl_).id;
      alive_put_ = false;
    }
    // The alive key lives as long as the lease it was put with: put it once per lease. A beat
    // is then one renewal, which etcd's leader answers without a raft write (the transaction
    // that checked the key's lease on every beat was one, with a WAL fsync: 1,000 a second at
    // 2,048 agents beating every 2 s).
    if (!alive_put_) {
      client.put(full("alive/" + self_), "1", lease_);
      alive_put_ = true;
    }
  }

  std::vector<std::string> dead(const std::vector<std::string>& node_ids) override {
    return absent(node_ids, false);
  }

  std::vector<std::string> gone(const std::vector<std::string>& node_ids) override {
    return absent(node_ids, true);
  }

  void leave() override {
    store_->set(store_key("left/" + self_), to_bytes("1"));
    if (lease_ != 0) store_->client().lease_revoke(lease_);  // deletes the alive key at once
    lease_ = 0;
  }

 private:
  // The nodes whose lease expired (or that never took one within the window); those that left
  // cleanly too when `left_counts`.
  //
  // A node seen alive is not read again while its lease surely lives: dead() asks etcd how long
  // the lease has left (one timetolive call, the leader's answer from memory) and looks again
  // a second before that, instead of reading both neighbours' keys every keep-alive step (4 a
  // keep-alive interval; with the event key's re-reads, which EtcdStore's watch now spares, that
  // was half of etcd's keep-alive requests at 512 simulated agents: 1,904 a second, 1,002 after).
  // A dead node's lease runs out at the same moment either way, and the steps around it look
  // every step, so it is seen as early as before.
  std::vector<std::string> absent(const std::vector<std::string>& node_ids, bool left_counts) {
    std::vector<std::string> result;
    const TimePoint now = clock_.now();
    std::vector<std::string> to_read;
    for (const auto& id : node_ids) {
      if (id == self_) continue;
      if (!left_counts && lease_lives(seen_[id], now)) continue;
      to_read.push_back(id);
    }
    for (size_t start = 0; start < to_read.size(); start += kNodesPerTxn) {
      const size_t end = std::min(to_read.size(), start + kNodesPerTxn);
      std::vector<std::string> ids(to_read.begin() + static_cast<std::ptrdiff_t>(start),
                                   to_read.begin() + static_cast<std::ptrdiff_t>(end));
      std::vector<etcd::Op> ops;
      for (const auto& id : ids) {
        ops.push_back(etcd::Op::get(full("alive/" + id)));  // its value names the lease
        auto left = etcd::Op::get(full("left/" + id));
        left.count_only = true;
        ops.push_back(std::move(left));
      }
      auto t = store_->client().txn({}, ops, {});
      DL_CHECK(t.responses.size() == ops.size())
          << "etcd answered " << t.responses.size() << " of " << ops.size() << " ranges";
      for (size_t i = 0; i < ids.size(); ++i) {
        const auto& alive = t.responses[2 * i].range.kvs;
        const bool left = t.responses[2 * i + 1].range.count > 0;
        auto& seen = seen_[ids[i]];
        if (!alive.empty()) {
          seen = {true, TimePoint::max(), alive.front().lease, now};
        } else if (left) {
          seen.lease = 0;
          if (left_counts) result.push_back(ids[i]);
        } else {
          seen.lease = 0;
          // Never seen alive: a node that just joined may not have beaten yet; give it the
          // window before calling it dead, as the store liveness does.
          if (seen.first_missing == TimePoint::max()) seen.first_missing = now;
          if (seen.was_alive || now - seen.first_missing >= window_) result.push_back(ids[i]);
        }
      }
    }
    return result;
  }

  // The Store-level key (EtcdStore adds its own prefix).
  std::string store_key(const std::string& suffix) const { return prefix_ + "/" + suffix; }
  // The etcd key.
  std::string full(const std::string& suffix) const { return store_->prefix() + store_key(suffix); }

  struct Seen {
    bool was_alive = false;
    TimePoint first_missing = TimePoint::max();
    int64_t lease = 0;       // the lease its alive key was last seen with (0: none known)
    TimePoint next_look{};   // until then the lease surely lives (etcd said so)
  };

  // Whether `seen`'s lease is known to live now: before the look it scheduled, or by etcd's
  // answer now, which schedules the next look a second before the lease could run out (etcd
  // truncates the seconds left); with under two seconds left, the next keep-alive step looks
  // again, one call as before. False: the lease is gone, read the node's keys.
  bool lease_lives(Seen& seen, TimePoint now) {
    if (seen.lease == 0) return false;
    if (now < seen.next_look) return true;
    const std::optional<int64_t> left = store_->client().lease_time_to_live(seen.lease);
    if (!left) {
      seen.lease = 0;  // expired, or the node took a new lease: its key says which
      return false;
    }
    seen.next_look = now + std::chrono::seconds(std::max<int64_t>(*left - 1, 0));
    return true;
  }

  std::shared_ptr<EtcdStore> store_;
  std::string prefix_, self_;
  Duration window_;
  int64_t ttl_;
  const Clock& clock_;
  int64_t lease_ = 0;
  bool alive_put_ = false;  // the alive key carries lease_
  std::unordered_map<std::string, Seen> seen_;
};

}  // namespace

EtcdRendezvous::EtcdRendezvous(const RendezvousParams& params)
    : run_id_(params.run_id),
      host_(params.host.empty() ? "127.0.0.1" : params.host),
      config_(RendezvousConfig::parse(params.config)) {
  if (params.endpoint.empty()) {
    throw UsageError(etcd::endpoints_needed_message());
  }
  token_ = params.token ? params.token : load_job_token(config_.token_file);
  const std::string endpoint = params.endpoint;
  const std::string prefix = run_prefix(params.run_id);
  store_ = std::make_shared<EtcdStore>(make_client(endpoint), prefix);
  // Fail now, naming etcd, rather than inside the state machine.
  store_->client().range(prefix, "", true);
  RendezvousParams p = params;
  p.backend = "etcd";
  p.store = store_;
  // Background threads get their own client (own connections), as with the TCP store.
  p.open_store = [endpoint, prefix]() -> std::shared_ptr<Store> {
    return std::make_shared<EtcdStore>(make_client(endpoint), prefix);
  };
  p.liveness = make_lease_liveness;
  ledger_ = std::make_shared<EtcdRoundLedger>(
      store_, DynamicRendezvous::key_prefix(params.run_id), config_.keep_alive_interval,
      params.clock ? *params.clock : steady_clock());
  inner_ = std::make_unique<DynamicRendezvous>(p, ledger_);
}

EtcdRendezvous::~EtcdRendezvous() { shutdown(); }

RendezvousResult EtcdRendezvous::next_rendezvous() {
  RendezvousResult r = inner_->next_rendezvous();
  // Under the round's prefix, so the waiting nodes see it on the watch they already have.
  const std::string key = ledger_->round_key(r.round, "workers_store");
  std::string where;
  if (r.group_rank == 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!server_) {
      TcpStoreServerOptions o;
      o.host = host_;
      o.port = 0;
      o.token = token_;
      server_ = std::make_unique<TcpStoreServer>(o);
      server_->start();
      log_info("etcd rendezvous '{}': hosting the workers' store on {}", run_id_,
               HostPort{host_, server_->port()}.to_string());
    }
    where = HostPort{host_, server_->port()}.to_string();
    // Before the address is published, so every worker of the round gets the round's
    // namespace (the same server may serve several rounds).
    TcpStoreClientOptions self;
    self.host = host_;
    self.port = server_->port();
    self.token = token_;
    self.agent = true;
    TcpStoreClient client(self);
    begin_worker_namespace(client, worker_namespace(run_id_, r.round));
    store_->set(key, to_bytes(where));
  } else {
    try {
      where = to_string(ledger_->wait_key(r.round, key, steady_clock().now() + config_.join_timeout));
    } catch (const TimeoutError&) {
      throw TimeoutError(fmt::format(
          "etcd rendezvous '{}' round {}: node rank 0 ({}) never published the workers' store "
          "address within join_timeout ({} s); it may have died right after the round",
          run_id_, r.round, r.hosts.empty() ? "?" : r.hosts[0],
          to_seconds(config_.join_timeout)));
    }
  }
  HostPort hp = parse_host_port(where, 0, "the workers' store address in etcd");
  r.master_addr = hp.host;
  r.master_port = hp.port;
  return r;
}

void EtcdRendezvous::prepare_watch() { inner_->prepare_watch(); }

void EtcdRendezvous::watch(std::function<void(const RendezvousEvent&)> on_event) {
  inner_->watch(std::move(on_event));
}
void EtcdRendezvous::request_restart(const std::string& report) { inner_->request_restart(report); }
FailureVerdict EtcdRendezvous::settle_failure() { return inner_->settle_failure(); }
void EtcdRendezvous::begin_leaving() { inner_->begin_leaving(); }
int64_t EtcdRendezvous::num_nodes_waiting() { return inner_->num_nodes_waiting(); }
void EtcdRendezvous::mark_finished() { inner_->mark_finished(); }
std::string EtcdRendezvous::joined_so_far() const { return inner_->joined_so_far(); }
void EtcdRendezvous::set_closed() { inner_->set_closed(); }
bool EtcdRendezvous::is_closed() { return inner_->is_closed(); }

void EtcdRendezvous::shutdown() {
  if (inner_) inner_->shutdown();
  std::lock_guard<std::mutex> lock(mutex_);
  if (server_) server_->stop();
}

void EtcdRendezvous::drive_keep_alive_externally() { inner_->drive_keep_alive_externally(); }
bool EtcdRendezvous::keep_alive_step() { return inner_->keep_alive_step(); }

std::shared_ptr<EtcdStore> open_etcd_run_store(const std::string& endpoint,
                                               const std::string& run_id,
                                               Duration request_timeout) {
  etcd::ClientOptions o;
  o.endpoint = endpoint;
  o.connect_timeout = std::min(o.connect_timeout, request_timeout);
  o.request_timeout = request_timeout;
  auto store = std::make_shared<EtcdStore>(std::make_shared<etcd::Client>(o), run_prefix(run_id));
  store->set_timeout(request_timeout);
  return store;
}

int64_t lease_ttl_seconds(Duration window) {
  return std::max<int64_t>(2, static_cast<int64_t>(std::ceil(to_seconds(window))));
}

std::unique_ptr<Liveness> make_lease_liveness(std::shared_ptr<Store> store,
                                              const std::string& prefix, const std::string& self_id,
                                              Duration window, const Clock& clock) {
  auto etcd_store = std::dynamic_pointer_cast<EtcdStore>(store);
  if (!etcd_store) {
    throw UsageError("lease liveness needs an etcd store (--rdzv_backend etcd)");
  }
  return std::make_unique<LeaseLiveness>(std::move(etcd_store), prefix, self_id, window, clock);
}

std::unique_ptr<RendezvousHandler> make_etcd_rendezvous(const RendezvousParams& params) {
  return std::make_unique<EtcdRendezvous>(params);
}

}  // namespace dlaunch
