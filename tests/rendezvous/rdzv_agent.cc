// A minimal rendezvous agent for multi-host tests (network namespaces): optionally hosts the
// store, then loops over rendezvous rounds, printing one line per round and per event, the way
// the real agent re-forms on a membership change. No workers.
//
//   rdzv_agent --endpoint A:P --host NAME --nnodes MIN:MAX [--serve BIND_ADDR] [--conf k=v,...]
//
// Output: "ROUND <round> <group_rank> <group_world_size>" and "EVENT <kind> <reason>".
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>

#include "common/log.h"
#include "rendezvous/tcp/host_port.h"
#include "rendezvous/handlers/rendezvous_registry.h"
#include "rendezvous/tcp/tcp_store_server.h"

using namespace dlaunch;

int main(int argc, char** argv) {
  std::string endpoint, host = "agent", nnodes = "1:1", serve, conf;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--endpoint") endpoint = v;
    else if (a == "--host") host = v;
    else if (a == "--nnodes") nnodes = v;
    else if (a == "--serve") serve = v;
    else if (a == "--conf") conf = v;
    else {
      std::fprintf(stderr, "rdzv_agent: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    std::unique_ptr<TcpStoreServer> server;
    if (!serve.empty()) {
      TcpStoreServerOptions o;
      o.host = serve;
      o.port = parse_host_port(endpoint, 29400, "--endpoint").port;
      server = std::make_unique<TcpStoreServer>(o);
      server->start();
    }
    RendezvousParams p;
    p.backend = "c10d";
    p.run_id = "netns";
    auto colon = nnodes.find(':');
    p.min_nodes = std::stoll(nnodes.substr(0, colon));
    p.max_nodes = std::stoll(nnodes.substr(colon + 1));
    p.endpoint = endpoint;
    p.host = host;
    p.config = RendezvousConfig::split(conf);
    auto handler = create_rendezvous_handler(p);
    while (true) {
      auto r = handler->next_rendezvous();
      std::printf("ROUND %lld %lld %lld\n", (long long)r.round, (long long)r.group_rank,
                  (long long)r.group_world_size);
      std::mutex m;
      std::condition_variable cv;
      bool fired = false;
      handler->watch([&](const RendezvousEvent& e) {
        const char* kind = e.kind == RendezvousEvent::Kind::kMembershipChanged ? "membership"
                           : e.kind == RendezvousEvent::Kind::kRestartRequested ? "restart"
                                                                                 : "shutdown";
        std::printf("EVENT %s %s\n", kind, e.reason.c_str());
        std::lock_guard<std::mutex> lock(m);
        fired = true;
        cv.notify_all();
      });
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return fired; });
    }
  } catch (const std::exception& e) {
    std::printf("ERROR %s\n", e.what());
    return 1;
  }
}
