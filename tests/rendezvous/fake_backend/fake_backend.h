// --rdzv_backend fake: a test-only rendezvous backend, to show what adding one takes: this
// folder, and one registration line (fake_dlaunch_main.cc registers it before dlaunch runs;
// a built-in backend's line is in rendezvous/builtin_backends.cc).
//
// One node per job (--nnodes 1), group rank 0. --rdzv_endpoint HOST[:PORT] (default port
// kFakeDefaultPort) is what the workers get as MASTER_ADDR/MASTER_PORT; nobody listens there,
// which the test's workers (sh) do not mind. The agents' store is in memory.
#pragma once

#include <cstdint>

#include "rendezvous/handlers/rendezvous_registry.h"

namespace dlaunch::testing {

inline constexpr uint16_t kFakeDefaultPort = 29999;

RendezvousBackend fake_rendezvous_backend();

}  // namespace dlaunch::testing
