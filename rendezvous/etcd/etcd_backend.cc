#include "rendezvous/etcd/etcd_backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netdb.h>

#include "common/error.h"
#include "rendezvous/etcd/etcd_endpoints.h"
#include "rendezvous/etcd/etcd_rendezvous.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/tcp/name_wait.h"

namespace dlaunch {

namespace {

void check_etcd_flags(const BackendFlags& f) {
  if (f.endpoint.empty()) throw UsageError(etcd::endpoints_needed_message());
  etcd::parse_endpoints(f.endpoint, "--rdzv_endpoint");
}

// An etcd whose every member's name surely does not resolve fails every attempt the same way:
// refused before the launch. A lookup that failed only for now (a DNS server that did not
// answer) is no reason: the client retries.
std::optional<std::string> etcd_names_unresolved(const BackendFlags& f) {
  if (f.endpoint.empty()) return std::nullopt;
  std::vector<std::string> reasons;
  for (const auto& member : etcd::parse_endpoints(f.endpoint, "--rdzv_endpoint")) {
    const int rc = name_lookup_code(member.host);
    if (rc != EAI_NONAME && rc != EAI_NODATA) return std::nullopt;  // fails over to this one
    reasons.push_back(fmt::format("{} ({})", member.host, ::gai_strerror(rc)));
  }
  return fmt::format(
      "--rdzv_endpoint={}: no etcd member's host name resolves: {}; expected the host:port of "
      "etcd's client URL (as `etcdctl --endpoints` takes it): check the name",
      f.endpoint, fmt::join(reasons, ", "));
}

// The agents published their status under the run's keys in etcd, beside the rendezvous.
std::shared_ptr<Store> open_etcd_job_store(const std::string& endpoint, const std::string& run_id,
                                           Duration timeout, std::string& where) {
  const std::string members =
      etcd::format_endpoints(etcd::parse_endpoints(endpoint, "--rdzv_endpoint"));
  where = "etcd at " + members;
  return open_etcd_run_store(members, run_id, timeout);
}

}  // namespace

RendezvousBackend etcd_rendezvous_backend() {
  RendezvousBackend b;
  b.name = "etcd";
  b.declined_names = {
      {"etcd-v2",
       "is torchrun's backend for etcd's v2 API, which dlaunch does not speak; use "
       "--rdzv_backend etcd (etcd's v3 API, etcd 3.4 or newer)"}};
  b.default_port = etcd::kDefaultClientPort;
  b.store_hosting = StoreHosting::kNone;
  // torchrun's etcd backends: the connection's scheme and TLS files, their key prefix and
  // timeout.
  b.ignored_conf_keys = {"protocol", "ssl_cert", "ssl_cert_key", "ca_cert",    "cacert",
                         "cert",     "key",      "etcd_prefix",  "timeout"};
  b.check_flags = check_etcd_flags;
  b.resolve_endpoint = [](const BackendFlags& f) { return f.endpoint; };
  b.preflight = etcd_names_unresolved;
  b.create = make_etcd_rendezvous;
  b.open_job_store = open_etcd_job_store;
  b.job_endpoint_hint = fmt::format(
      "etcd's client URL (or its members' list) as the job was given it (e.g. 10.0.0.5:{})",
      etcd::kDefaultClientPort);
  return b;
}

}  // namespace dlaunch
