#include "launcher/agent/exit_barrier.h"

#include <fmt/format.h>

#include <exception>
#include <string>

#include "common/log.h"

namespace dlaunch {

namespace {

// The last of `nodes` to count itself in under `key` sets `key/done`, which the others wait for.
void count_in(Store& store, const std::string& key, int64_t nodes) {
  if (store.add(key, 1) >= nodes) store.set(key + "/done", to_bytes("1"));
}

}  // namespace

void wait_exit_barrier(Store& store, int64_t round, int64_t nodes, Duration timeout) {
  std::string key = fmt::format("dlaunch/exit_barrier/{}", round);
  count_in(store, key, nodes);
  store.wait({key + "/done"}, timeout);
}

void leave_exit_barrier(Store& store, int64_t round, int64_t nodes, bool hosts_store,
                        Duration timeout) {
  std::string key = fmt::format("dlaunch/exit_barrier/{}/left", round);
  try {
    count_in(store, key, nodes);
    if (hosts_store) store.wait({key + "/done"}, timeout);
  } catch (const std::exception& e) {
    if (hosts_store) {
      log_warning("not every node confirmed leaving within {:.0f} s: {}; closing the store",
                  to_seconds(timeout), e.what());
    } else {
      log_debug("could not confirm leaving the job: {}", e.what());
    }
  }
}

}  // namespace dlaunch
