// --rdzv_backend etcd as a descriptor (rendezvous_registry.h): the elastic rendezvous kept in an
// etcd cluster (etcd_rendezvous.h); no agent hosts a store for it, and `dlaunch status` finds
// the job's agents in etcd. Stands in for torchrun's etcd-v2, which it declines by name.
#pragma once

#include "rendezvous/handlers/rendezvous_registry.h"

namespace dlaunch {

RendezvousBackend etcd_rendezvous_backend();

}  // namespace dlaunch
