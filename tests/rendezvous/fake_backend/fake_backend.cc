#include "tests/rendezvous/fake_backend/fake_backend.h"

#include <fmt/format.h>

#include <atomic>
#include <memory>

#include "common/error.h"
#include "rendezvous/store/in_memory_store.h"
#include "rendezvous/store/prefix_store.h"
#include "rendezvous/tcp/host_port.h"

namespace dlaunch::testing {

namespace {

class FakeRendezvous final : public RendezvousHandler {
 public:
  explicit FakeRendezvous(const RendezvousParams& p)
      : params_(p), store_(std::make_shared<InMemoryStore>()) {}

  std::string backend() const override { return "fake"; }
  std::string run_id() const override { return params_.run_id; }

  RendezvousResult next_rendezvous() override {
    if (closed_) throw StateError("the fake rendezvous is closed");
    RendezvousResult r;
    r.round = round_++;
    r.group_rank = 0;
    r.group_world_size = 1;
    r.local_world_sizes = {params_.local_world_size};
    r.hosts = {params_.host};
    HostPort master = parse_host_port(params_.endpoint, kFakeDefaultPort, "--rdzv_endpoint");
    r.master_addr = master.host;
    r.master_port = master.port;
    r.restart_count = restarts_;
    r.store = std::make_shared<PrefixStore>("dlaunch/job/" + params_.run_id, store_);
    return r;
  }
  void watch(std::function<void(const RendezvousEvent&)>) override {}
  void request_restart(const std::string&) override { ++restarts_; }
  int64_t num_nodes_waiting() override { return 0; }
  void set_closed() override { closed_ = true; }
  bool is_closed() override { return closed_; }
  void shutdown() override {}

 private:
  RendezvousParams params_;
  std::shared_ptr<Store> store_;
  int64_t round_ = 0;
  std::atomic<int64_t> restarts_{0};
  std::atomic<bool> closed_{false};
};

void check_fake_flags(const BackendFlags& f) {
  if (f.endpoint.empty()) {
    throw UsageError(
        "--rdzv_backend fake needs --rdzv_endpoint HOST[:PORT], the address its workers get as "
        "MASTER_ADDR/MASTER_PORT");
  }
  if (f.max_nodes != 1) {
    throw UsageError(fmt::format("--rdzv_backend fake runs one node; --nnodes={} asks for more",
                                 f.max_nodes));
  }
  parse_host_port(f.endpoint, kFakeDefaultPort, "--rdzv_endpoint");
}

}  // namespace

RendezvousBackend fake_rendezvous_backend() {
  RendezvousBackend b;
  b.name = "fake";
  b.default_port = kFakeDefaultPort;
  b.store_hosting = StoreHosting::kNone;
  b.ignored_conf_keys = {"fake_only_key"};
  b.check_flags = check_fake_flags;
  b.resolve_endpoint = [](const BackendFlags& f) { return f.endpoint; };
  b.create = [](const RendezvousParams& p) { return std::make_unique<FakeRendezvous>(p); };
  return b;
}

}  // namespace dlaunch::testing
