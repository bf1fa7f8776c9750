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
#include "rendezvous/tcp/default_ports.h"
#include "rendezvous/tcp/host_port.h"
#include "rendezvous/tcp/job_token.h"
#include "rendezvous/tcp/tcp_store_client.h"

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

const std::vector<std::string>& RendezvousConfig::keys() {
  static const std::vector<std::string> kKeys = {"join_timeout",        "last_call_timeout",
                                                 "keep_alive_interval", "keep_alive_max_attempt",
                                                 "close_timeout",       "token_file"};
  return kKeys;
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

struct Registry {
  std::mutex mutex;
  // In the order of registration, which the messages listing the backends keep.
  std::vector<std::shared_ptr<const RendezvousBackend>> backends;
};

void add_backend(Registry& r, RendezvousBackend backend) {
  auto entry = std::make_shared<const RendezvousBackend>(std::move(backend));
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto& b : r.backends) {
    if (b->name == entry->name) {
      b = entry;
      return;
    }
  }
  r.backends.push_back(entry);
}

// The registry, the built-in backends in it before anyone looks or adds (see
// builtin_rendezvous_backends() in the header for why not static registrars).
Registry& registry() {
  static Registry* r = [] {
    auto* fresh = new Registry;  // never destroyed: agents' threads may look up at exit
    for (auto& b : builtin_rendezvous_backends()) add_backend(*fresh, std::move(b));
    return fresh;
  }();
  return *r;
}

std::vector<std::shared_ptr<const RendezvousBackend>> all_backends() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.backends;
}

}  // namespace

void register_rendezvous_backend(RendezvousBackend backend) {
  add_backend(registry(), std::move(backend));
}

std::shared_ptr<const RendezvousBackend> find_rendezvous_backend(const std::string& name) {
  for (const auto& b : all_backends()) {
    if (b->name == name) return b;
  }
  return nullptr;
}

std::vector<std::string> rendezvous_backend_names() {
  std::vector<std::string> names;
  for (const auto& b : all_backends()) names.push_back(b->name);
  return names;
}

std::optional<std::string> declined_rendezvous_backend(const std::string& name) {
  for (const auto& b : all_backends()) {
    if (auto it = b->declined_names.find(name); it != b->declined_names.end()) return it->second;
  }
  return std::nullopt;
}

std::vector<std::string> ignored_rendezvous_conf_keys() {
  std::vector<std::string> keys;
  for (const auto& b : all_backends()) {
    keys.insert(keys.end(), b->ignored_conf_keys.begin(), b->ignored_conf_keys.end());
  }
  return keys;
}

std::unique_ptr<RendezvousHandler> create_rendezvous_handler(const RendezvousParams& params) {
  auto backend = find_rendezvous_backend(params.backend);
  if (!backend || !backend->create) {
    std::vector<std::string> known = rendezvous_backend_names();
    std::sort(known.begin(), known.end());
    throw UsageError(fmt::format("--rdzv_backend {} is not known; expected one of: {}",
                                 params.backend, fmt::join(known, ", ")));
  }
  return backend->create(params);
}

namespace detail {

namespace {

// Where and as whom an agent's connection to the job's store connects: declared an agent's, so
// it sees the store unscoped, outside the workers' per-round namespace (worker_namespace.h),
// and of its run, so that another job's store on the same endpoint refuses it.
TcpStoreClientOptions agent_store_options(const RendezvousParams& params,
                                          const RendezvousConfig& config) {
  HostPort hp = parse_host_port(params.endpoint, kDefaultRendezvousPort, "--rdzv_endpoint");
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
