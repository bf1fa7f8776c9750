#include "rendezvous/handlers/rendezvous_registry.h"

#include <sys/random.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <mutex>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "rendezvous/handlers/dynamic_rendezvous.h"
#include "rendezvous/etcd/etcd_rendezvous.h"
#include "rendezvous/tcp/host_port.h"
#include "rendezvous/tcp/job_token.h"
#include "rendezvous/handlers/static_rendezvous.h"
#include "rendezvous/tcp/store_host.h"
#include "rendezvous/tcp/tcp_store_client.h"
#include "rendezvous/tcp/tcp_store_server.h"

namespace dlaunch {

// ---- RendezvousResult ----------------------------------------------------------------------

int64_t RendezvousResult::world_size() const {
  int64_t n = 0;
  for (auto l : local_world_sizes) n += l;
  return n;
}

int64_t RendezvousResult::global_rank_base() const {
  int64_t n = 0;
  for (int64_t i = 0; i < group_rank && i < static_cast<int64_t>(local_world_sizes.size()); ++i) {
    n += local_world_sizes[i];
  }
  return n;
}

// ---- config --------------------------------------------------------------------------------

namespace {

Duration parse_seconds(const std::string& key, const std::string& value) {
  double s = parse_double(value, fmt::format("--rdzv_conf {}", key));
  // !(s <= 1e7) also refuses nan, which every comparison lets through.
  if (s < 0 || !(s <= 1e7)) {
    throw UsageError(fmt::format("--rdzv_conf {}={}: expected a number of seconds from 0 to 1e7",
                                 key, value));
  }
  return from_seconds(s);
}

}  // namespace

std::map<std::string, std::string> RendezvousConfig::split(const std::string& text) {
  std::map<std::string, std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos
                                                                     : comma - start);
    start = comma == std::string::npos ? text.size() : comma + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw UsageError(
          fmt::format("--rdzv_conf: '{}' is not key=value (e.g. join_timeout=900)", item));
    }
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

RendezvousConfig RendezvousConfig::parse(const std::map<std::string, std::string>& conf) {
  RendezvousConfig c;
  for (const auto& [key, value] : conf) {
    if (key == "join_timeout") {
      c.join_timeout = parse_seconds(key, value);
    } else if (key == "last_call_timeout") {
      c.last_call_timeout = parse_seconds(key, value);
    } else if (key == "keep_alive_interval") {
      c.keep_alive_interval = parse_seconds(key, value);
      if (c.keep_alive_interval <= Duration::zero()) {
        throw UsageError(
            fmt::format("--rdzv_conf keep_alive_interval={}: expected seconds > 0", value));
      }
    } else if (key == "keep_alive_max_attempt") {
      c.keep_alive_max_attempt = parse_int(value, "--rdzv_conf keep_alive_max_attempt");
      if (c.keep_alive_max_attempt < 1) {
        throw UsageError(fmt::format("--rdzv_conf keep_alive_max_attempt={}: expected >= 1", value));
      }
    } else if (key == "close_timeout") {
      c.close_timeout = parse_seconds(key, value);
    } else if (key == "token_file") {
      c.token_file = value;
    } else {
      log_warning("--rdzv_conf: ignoring unknown option {}={}", key, value);
    }
  }
  return c;
}

Duration join_timeout_in(const std::map<std::string, std::string>& conf) {
  auto it = conf.find("join_timeout");
  if (it == conf.end()) return RendezvousConfig().join_timeout;
  return RendezvousConfig::parse({*it}).join_timeout;
}

// ---- registry ------------------------------------------------------------------------------

namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

// static: node rank 0 hosts the store on the endpoint; it must (nobody else will).
std::unique_ptr<RendezvousHandler> make_static_rendezvous(const RendezvousParams& p) {
  std::shared_ptr<TcpStoreServer> server;
  if (p.host_store && p.node_rank == 0) {
    server = host_job_store(
        parse_host_port(p.endpoint, 29500, "--rdzv_endpoint"), join_timeout_in(p.config), p.token,
        p.run_id,
        "pass a free --master_port (node 0 publishes it to nobody else, so every node needs the "
        "same value)");
  }
  auto handler = std::make_unique<StaticRendezvous>(p);
  handler->keep_hosted_store(std::move(server));
  return handler;
}

// c10d: torchrun's rule: the agent that can bind the endpoint hosts the store; the rest connect.
std::unique_ptr<RendezvousHandler> make_c10d_rendezvous(const RendezvousParams& p) {
  std::shared_ptr<TcpStoreServer> server;
  RendezvousParams params = p;
  if (p.host_store) {
    HostPort where = parse_host_port(p.endpoint, 29400, "--rdzv_endpoint");
    server = try_host_job_store(where, join_timeout_in(p.config), p.token, p.run_id);
    // Port 0 (torchrun's --standalone spelling): join the store on the port it was given.
    if (server && where.port == 0) {
      where.port = server->port();
      params.endpoint = where.to_string();
    }
  }
  auto handler = std::make_unique<DynamicRendezvous>(params);
  handler->keep_hosted_store(std::move(server));
  return handler;
}

std::map<std::string, RendezvousFactory>& registry() {
  static std::map<std::string, RendezvousFactory> r = {
      {"static", make_static_rendezvous},
      {"c10d", make_c10d_rendezvous},
      // etcd keeps the rendezvous: no agent hosts a store for it (etcd_rendezvous.h).
      {"etcd", make_etcd_rendezvous},
  };
  return r;
}

}  // namespace

void register_rendezvous_backend(const std::string& name, RendezvousFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[name] = std::move(factory);
}

std::unique_ptr<RendezvousHandler> create_rendezvous_handler(const RendezvousParams& params) {
  RendezvousFactory factory;
  std::vector<std::string> known;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(params.backend);
    if (it != registry().end()) factory = it->second;
    for (const auto& [name, f] : registry()) known.push_back(name);
  }
  if (!factory) {
    throw UsageError(fmt::format("--rdzv_backend {} is not known; expected one of: {}",
                                 params.backend, fmt::join(known, ", ")));
  }
  return factory(params);
}

namespace detail {

namespace {

// Where and as whom an agent's connection to the job's store connects: declared an agent's, so
// it sees the store unscoped, outside the workers' per-round namespace (worker_namespace.h),
// and of its run, so that another job's store on the same endpoint refuses it.
TcpStoreClientOptions agent_store_options(const RendezvousParams& params,
                                          const RendezvousConfig& config) {
  HostPort hp = parse_host_port(params.endpoint, 29400, "--rdzv_endpoint");
  TcpStoreClientOptions o;
  o.host = hp.host;
  o.port = hp.port;
  o.token = params.token ? params.token : load_job_token(config.token_file);
  o.agent = true;
  o.run_id = params.run_id;  // a store serving another run refuses this agent at once
  return o;
}

}  // namespace

std::shared_ptr<Store> connect_store(const RendezvousParams& params,
                                     const RendezvousConfig& config) {
  if (params.store) return params.store;
  if (params.endpoint.empty()) {
    throw UsageError("rendezvous: no store endpoint; give --rdzv_endpoint host:port (or "
                     "--master_addr/--master_port for static rendezvous)");
  }
  TcpStoreClientOptions o = agent_store_options(params, config);
  o.connect_timeout = config.join_timeout;
  // The first connect may wait for the host to start (join timeout); a store that answered
  // once and then does not for this long has died with its agent, and the caller must hear
  // so within seconds (the keep-alive declares the store lost), not after the join timeout.
  o.reconnect_timeout = std::min<Duration>(config.join_timeout, kStoreReconnectTimeout);
  return std::make_shared<TcpStoreClient>(o);
}

std::function<std::shared_ptr<Store>()> store_opener(const RendezvousParams& params,
                                                     const RendezvousConfig& config,
                                                     std::shared_ptr<Store> main_store) {
  if (params.open_store) return params.open_store;
  if (params.store || params.endpoint.empty()) {
    return [main_store] { return main_store; };
  }
  if (params.endpoint.empty()) throw UsageError("rendezvous: no store endpoint");
  // Connects lazily (at the thread's first call, which interrupt() can end) and for at most
  // kStoreReconnectTimeout per attempt: the threads retry, and shutdown() must stay quick when
  // the store host is gone. Replies are bounded by the keep-alive window (at least 5 s).
  TcpStoreClientOptions o = agent_store_options(params, config);
  o.connect_timeout = std::min<Duration>(config.join_timeout, kStoreReconnectTimeout);
  o.lazy_connect = true;
  o.timeout = std::max<Duration>(config.keep_alive_interval * config.keep_alive_max_attempt,
                                 std::chrono::seconds(5));
  return [o] { return std::make_shared<TcpStoreClient>(o); };
}

std::string make_node_id(const std::string& host) {
  // Four random bytes keep ids apart when a pid repeats across hosts of one name (containers);
  // they need no secrecy, so the kernel's getrandom serves and libcrypto stays unloaded.
  uint8_t salt[4] = {};
  while (::getrandom(salt, sizeof salt, 0) < 0 && errno == EINTR) {
  }
  std::string id = (host.empty() ? std::string("node") : host) + "-" + std::to_string(::getpid()) +
                   "-" + fmt::format("{:02x}", fmt::join(std::begin(salt), std::end(salt), ""));
  for (auto& ch : id) {
    if (ch == ' ' || ch == '\n' || ch == '|') ch = '_';
  }
  return id;
}

}  // namespace detail
}  // namespace dlaunch
