// The rendezvous backends dlaunch is built with, one line each; the registry reads this list
// before its first use (rendezvous/handlers/rendezvous_registry.h says why not static
// registrars). A new backend is a folder of its own with a function returning its descriptor,
// and one line here.
#include "rendezvous/etcd/etcd_backend.h"
#include "rendezvous/handlers/c10d_backend.h"
#include "rendezvous/handlers/rendezvous_registry.h"
#include "rendezvous/handlers/static_backend.h"

namespace dlaunch {

std::vector<RendezvousBackend> builtin_rendezvous_backends() {
  std::vector<RendezvousBackend> backends;
  backends.push_back(static_rendezvous_backend());
  backends.push_back(c10d_rendezvous_backend());
  backends.push_back(etcd_rendezvous_backend());
  return backends;
}

}  // namespace dlaunch
