// etcd_rdzv_agent: a stand-in agent for the etcd rendezvous tests and bench/etcd. It joins the
// etcd rendezvous like dlaunch does (the registry's "etcd" backend), prints one line per
// completed round, follows the pushed events (re-forming on "membership changed"), and runs
// until killed or until --rounds rounds are done. No workers are started: this isolates the
// rendezvous (its timing and its node-loss handling) from worker start-up.
//
//   etcd_rdzv_agent --endpoint 127.0.0.1:2379 --run_id job --nnodes 2:4 [--host 127.0.0.1]
//                   [--conf last_call_timeout=0.5,keep_alive_interval=1] [--rounds N]
//                   [--node_rank K] [--check_store]
//
// Output lines (stdout, flushed), times from CLOCK_MONOTONIC so processes on one host compare:
//   start t=SECONDS                          (first thing in main)
//   round R rank K size N master HOST:PORT t=SECONDS
//   event KIND t=SECONDS reason...
//   error MESSAGE
//   stat NAME... COUNT                       (--stats, at exit: etcd::call_counts())
// --check_store: after each round, set and read back a key in the workers' TCP store at
// MASTER (proves rank 0 hosts it and the others reach it).
// --stats: at exit, print what this agent asked of etcd (gateway calls by path, failed
// compare-and-swap transactions, watch events), for bench/etcd.
#include <time.h>

#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

#include "common/env.h"
#include "common/error.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/handlers/rendezvous_registry.h"
#include "rendezvous/tcp/tcp_store_client.h"

namespace {

double now_seconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

const char* kind_name(dlaunch::RendezvousEvent::Kind k) {
  switch (k) {
    case dlaunch::RendezvousEvent::Kind::kMembershipChanged:
      return "membership";
    case dlaunch::RendezvousEvent::Kind::kRestartRequested:
      return "restart";
    case dlaunch::RendezvousEvent::Kind::kShutdownRequested:
      return "shutdown";
    case dlaunch::RendezvousEvent::Kind::kStoreLost:
      return "store-lost";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dlaunch;
  std::printf("start t=%.6f\n", now_seconds());
  std::fflush(stdout);
  std::map<std::string, std::string> flags = {{"host", "127.0.0.1"}, {"rounds", "0"}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--check_store" || a == "--stats") {
      flags[a.substr(2)] = "1";
    } else if (a.rfind("--", 0) == 0 && i + 1 < argc) {
      flags[a.substr(2)] = argv[++i];
    } else {
      std::fprintf(stderr, "etcd_rdzv_agent: unexpected argument '%s'\n", a.c_str());
      return 2;
    }
  }
  try {
    RendezvousParams p;
    p.backend = "etcd";
    p.endpoint = flags.at("endpoint");
    p.run_id = flags.at("run_id");
    std::string nnodes = flags.at("nnodes");
    size_t colon = nnodes.find(':');
    p.min_nodes = parse_int(nnodes.substr(0, colon), "--nnodes");
    p.max_nodes =
        colon == std::string::npos ? p.min_nodes : parse_int(nnodes.substr(colon + 1), "--nnodes");
    p.host = flags.at("host");
    if (flags.count("node_rank")) p.node_rank = parse_int(flags["node_rank"], "--node_rank");
    if (flags.count("conf")) p.config = RendezvousConfig::split(flags["conf"]);
    const int64_t rounds = parse_int(flags["rounds"], "--rounds");

    auto handler = create_rendezvous_handler(p);
    std::mutex mu;
    std::condition_variable cv;
    bool reform = false;
    bool stop = false;
    for (int64_t done = 0; rounds == 0 || done < rounds; ++done) {
      RendezvousResult r = handler->next_rendezvous();
      std::printf("round %lld rank %lld size %lld master %s:%lld t=%.6f\n",
                  static_cast<long long>(r.round), static_cast<long long>(r.group_rank),
                  static_cast<long long>(r.group_world_size), r.master_addr.c_str(),
                  static_cast<long long>(r.master_port), now_seconds());
      std::fflush(stdout);
      if (flags.count("check_store")) {
        TcpStoreClientOptions o;
        o.host = r.master_addr;
        o.port = static_cast<uint16_t>(r.master_port);
        TcpStoreClient c(o);
        std::string k = "check/" + std::to_string(r.round) + "/" + std::to_string(r.group_rank);
        c.set(k, to_bytes("ok"));
        std::printf("store %s %s\n", k.c_str(), to_string(c.get(k)).c_str());
        std::fflush(stdout);
      }
      if (rounds != 0 && done + 1 >= rounds) break;
      {
        std::lock_guard<std::mutex> lock(mu);
        reform = false;
      }
      handler->watch([&](const RendezvousEvent& ev) {
        std::printf("event %s t=%.6f %s\n", kind_name(ev.kind), now_seconds(), ev.reason.c_str());
        std::fflush(stdout);
        std::lock_guard<std::mutex> lock(mu);
        if (ev.kind == RendezvousEvent::Kind::kShutdownRequested) stop = true;
        reform = true;
        cv.notify_all();
      });
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return reform; });
      if (stop) break;
    }
    handler->shutdown();
    if (flags.count("stats")) {
      for (const auto& [what, n] : etcd::call_counts()) {
        std::printf("stat %s %lld\n", what.c_str(), static_cast<long long>(n));
      }
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::printf("error %s\n", e.what());
    std::fflush(stdout);
    return 1;
  }
}
