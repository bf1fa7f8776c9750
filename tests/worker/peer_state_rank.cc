// One rank of a state exchange from a live peer (worker/train/peer_state.h) as a process of its
// own, for the test in which the source really dies: it joins a gloo group through the TCP store
// at 127.0.0.1:<port> and calls share_peer_state.
//
//   peer_state_rank <port> <rank> <world> <role> <result file>
//     role: source-killed  holds 1 MiB of state, sends it in 64 KiB chunks and SIGKILLs itself
//                          after the first one
//           survivor       holds state of its own (keeps it)
//           replacement    holds none (loads what arrives)
//   Writes {"outcome", "error", "loaded", "group_broken", "source", "bytes", "loads"} as JSON to
//   <result file>; exit 0 when it got that far, 2 on bad arguments, 1 on anything else.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "rendezvous/tcp/tcp_store_client.h"
#include "worker/comm/process_group_gloo.h"
#include "worker/train/peer_state.h"

namespace {

std::vector<uint8_t> state_bytes() {
  std::mt19937 gen(5);
  std::vector<uint8_t> out(size_t{1} << 20);
  for (auto& b : out) b = static_cast<uint8_t>(gen());
  return out;
}

int run(int argc, char** argv) {
  using namespace dlaunch;
  if (argc != 6) {
    std::fprintf(stderr, "usage: peer_state_rank PORT RANK WORLD ROLE RESULT_FILE\n");
    return 2;
  }
  const int port = std::stoi(argv[1]);
  const int rank = std::stoi(argv[2]);
  const int world = std::stoi(argv[3]);
  const std::string role = argv[4];
  if (role != "source-killed" && role != "survivor" && role != "replacement") {
    std::fprintf(stderr, "unknown role %s\n", role.c_str());
    return 2;
  }
  TcpStoreClientOptions client_options;
  client_options.port = static_cast<uint16_t>(port);
  TcpStoreClient store(client_options);
  comm::GlooOptions options;
  options.timeout = std::chrono::seconds(60);
  auto pg = comm::make_gloo_process_group(store, rank, world, options);

  train::PeerStateOptions exchange;
  exchange.chunk_bytes = 64 << 10;
  if (role == "source-killed") {
    exchange.on_chunk = [](uint64_t, uint64_t) { ::raise(SIGKILL); };
  }
  int loads = 0;
  const train::PeerStateResult r = train::share_peer_state(
      *pg, role != "replacement", [] { return state_bytes(); },
      [&](const std::vector<uint8_t>&, int) { ++loads; }, exchange);
  const nlohmann::json out = {{"outcome", train::peer_state_outcome_name(r.outcome)},
                              {"error", r.error},
                              {"loaded", r.loaded},
                              {"group_broken", r.group_broken},
                              {"source", r.source},
                              {"bytes", r.bytes},
                              {"loads", loads}};
  std::ofstream(argv[5]) << out.dump();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peer_state_rank: %s\n", e.what());
    return 1;
  }
}
