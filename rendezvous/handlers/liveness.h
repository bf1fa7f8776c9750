// Liveness of rendezvous participants, behind a small interface so the backend can choose how
// it is proven: heartbeat counters in the store (the default here), or leases (etcd).
//
// A node calls beat() every keep_alive_interval from its keep-alive thread; observers ask
// dead() about the nodes they watch. The store implementation compares counters against the
// observer's own clock (when did this counter last change?), so no clocks need to agree across
// hosts. A node that leaves cleanly calls leave(), so observers do not report it as dead.
// Blocking: each call is one or a few store round trips. Errors: the store's.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "rendezvous/store/store.h"

namespace dlaunch {

class Liveness {
 public:
  virtual ~Liveness() = default;
  // This node is alive. Called every keep-alive interval.
  virtual void beat() = 0;
  // Which of `node_ids` have not been seen alive for the configured window (and did not leave
  // cleanly). The first call about a node starts its window.
  virtual std::vector<std::string> dead(const std::vector<std::string>& node_ids) = 0;
  // This node leaves on purpose (job done); observers stop watching it.
  virtual void leave() = 0;
  // Lets this node's store connection speak for it when it ends, and judges the watched nodes
  // by theirs: the liveness registers the connection's last will (Store::set_will), and a
  // watched node whose connection ended (its agent was killed: the kernel closes a dead
  // process's sockets at once) and that neither connected again nor beat within `grace` is
  // dead without waiting out the window. Called on every new store connection of the
  // keep-alive. Does nothing where the store has no wills (an older server) or life is proven
  // otherwise (leases): the window alone judges then. Errors: the store's.
  virtual void use_connection_wills(Duration grace) { (void)grace; }
  // Whether the last dead() or gone() found `id` dead because its connection ended (above);
  // false: silent for the window.
  virtual bool found_by_connection_end(const std::string& id) const {
    (void)id;
    return false;
  }
  // The nodes watched from now on were alive a moment ago (they joined the round that now
  // runs): their windows start again at the next look, whatever their counters did before. A
  // liveness that proves life otherwise (leases) has nothing to forget.
  virtual void restart_windows() {}
  // Which of `node_ids` will not act any more: dead as above, or left cleanly. A node waiting
  // for a running round to end asks this: a round whose nodes all left (the whole job was
  // SIGTERMed, then started again with the same run id) has nobody to open the next round, as
  // one whose nodes all died. A liveness that cannot tell who left answers dead().
  virtual std::vector<std::string> gone(const std::vector<std::string>& node_ids) {
    return dead(node_ids);
  }
};

// Makes the liveness of `self_id`; `window` = keep_alive_interval x keep_alive_max_attempt.
using LivenessFactory = std::function<std::unique_ptr<Liveness>(
    std::shared_ptr<Store> store, const std::string& prefix, const std::string& self_id,
    Duration window, const Clock& clock)>;

// Heartbeats as counters at "<prefix>/hb/<node>" (add 1 per beat); "<prefix>/left/<node>" marks
// a clean exit. With use_connection_wills: "<prefix>/closed/<node>" is the keep-alive
// connection's will (the server adds 1 when it ends uncleared) and "<prefix>/opened/<node>"
// counts the connections that registered it (added to right after), read with the heartbeat in
// one request.
std::unique_ptr<Liveness> make_store_liveness(std::shared_ptr<Store> store,
                                              const std::string& prefix,
                                              const std::string& self_id, Duration window,
                                              const Clock& clock);

}  // namespace dlaunch
