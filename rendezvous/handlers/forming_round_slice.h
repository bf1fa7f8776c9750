// How long a node waiting in the round it joined sleeps before it looks at the round's arrival
// count again: the one rule both ledgers (store_ledger.h, etcd_ledger.h) follow.
//
// Only the round's first arrival measures the last call, re-reading the count every
// last_call_timeout / 5 (10-250 ms) and waking exactly when the last call ends. The others would
// be N pollers (16,384 x 5 reads/s on the TCP store; on etcd each count walks every join key of
// the round), so they look once per keep-alive interval, at most once a second: a first arrival
// that died costs at most that. A node waiting for the next round (`limits` null) does not
// measure anything and also sleeps at most a keep-alive interval.
#pragma once

#include "common/clock.h"
#include "rendezvous/handlers/dynamic_rendezvous_state.h"

namespace dlaunch {

// The sleep until the next look, never past `until` (<= 0: do not sleep). `measures_last_call`:
// this node is the first arrival of the round it waits in. `count` and `changed_at` are the
// arrivals this node last saw and when it saw them change.
Duration forming_round_slice(const DynamicLimits* limits, bool measures_last_call, int64_t count,
                             TimePoint changed_at, Duration keep_alive_interval, TimePoint now,
                             TimePoint until);

}  // namespace dlaunch
