// --rdzv_backend static as a descriptor (rendezvous_registry.h): --nnodes N, --node_rank K, and
// node rank 0 hosting the store at --master_addr:--master_port (or --rdzv_endpoint). A one-node
// job runs no rendezvous at all. The handler is static_rendezvous.h.
#pragma once

#include "rendezvous/handlers/rendezvous_registry.h"

namespace dlaunch {

RendezvousBackend static_rendezvous_backend();

}  // namespace dlaunch
