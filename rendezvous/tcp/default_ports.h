// The ports a job's TCP store listens on when the flags name none, torchrun's: 29500 for the
// master (--master_port; the static backend's store), 29400 for c10d's --rdzv_endpoint.
// etcd's client port (2379) is etcd::kDefaultClientPort (rendezvous/etcd/etcd_endpoints.h).
#pragma once

#include <cstdint>

namespace dlaunch {

inline constexpr uint16_t kDefaultMasterPort = 29500;
inline constexpr uint16_t kDefaultRendezvousPort = 29400;

}  // namespace dlaunch
