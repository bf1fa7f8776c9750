// --rdzv_backend c10d as a descriptor (rendezvous_registry.h): torchrun's elastic rendezvous
// (dynamic_rendezvous.h) over the job's TCP store, hosted by whichever agent binds
// --rdzv_endpoint first.
#pragma once

#include "rendezvous/handlers/rendezvous_registry.h"

namespace dlaunch {

RendezvousBackend c10d_rendezvous_backend();

}  // namespace dlaunch
