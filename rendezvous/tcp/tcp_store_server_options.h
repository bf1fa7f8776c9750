// What a TCP store server is told at its start (rendezvous/tcp/tcp_store_server.h): its own
// header so the server's connections (tcp_store_connection.h) read it without including the
// server that owns them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "rendezvous/tcp/store_codec.h"

namespace dlaunch {

struct TcpStoreServerOptions {
  std::string host = "127.0.0.1";  // address to bind; "0.0.0.0" or "::" only when asked
  uint16_t port = 0;               // 0: pick a free port
  std::optional<std::string> token;
  bool admit_unauthenticated_from_agent_hosts = true;
  // The run (--rdzv_id) this store serves; agents of another run are refused. Empty: any.
  std::string run_id;
  wire::Limits limits;
  int backlog = 4096;
  // false: FEATURES, WAIT_GET and DECLARE_RUN close the connection as unknown opcodes, as a dlaunch
  // build older than them does; for tests of a newer agent meeting an older store host.
  bool knows_features = true;
};

}  // namespace dlaunch
