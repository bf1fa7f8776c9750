// Whether a worker failure spends the job's restart budget, settled per round by the nodes of
// the dynamic rendezvous (dynamic_rendezvous.h) through the store.
//
// A worker failure is published at once, but whether it spends the budget is settled per round
// (settle): every node that sees the failure adds itself to round/<r>/acks (ack); when all
// participants did, the verdict "charged" is written (round/<r>/verdict, first writer wins) and
// restart_count incremented once. A participant that died never acks; its keep-alive observer
// writes the verdict "lost" instead (keep_alive.h, through write), so the restart is free and
// the cause is the lost node, not its peers' connection errors.
//
// Keys, under the rendezvous prefix:
//   round/<r>/acks, /verdict   nodes that saw the round's failure; "C|<writer>" (charged) or
//                              "L|<who> lost ...|<writer>"; <writer> is the writer's node id,
//                              so compare_set tells the first writer apart
//   restart_count              job-wide count of failure restarts
//
// Thread-safe: the event watcher's thread, the agent's and the keep-alive's call in.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/clock.h"
#include "rendezvous/handlers/rendezvous_handler.h"
#include "rendezvous/handlers/store_loss.h"
#include "rendezvous/store/store.h"

namespace dlaunch {

class FailureVerdicts {
 public:
  struct Settings {
    std::string run_id;   // for messages
    std::string prefix;   // the rendezvous' keys ("dlaunch/rdzv/<run_id>")
    std::string node_id;  // this node's, in the verdicts it writes
    // The keep-alive's: a dead node's observer rules within interval x max_attempt.
    Duration keep_alive_interval = std::chrono::seconds(5);
    int64_t keep_alive_max_attempt = 3;
  };
  // `store`: the handler's; `loss` ends a settle at once.
  FailureVerdicts(Settings settings, std::shared_ptr<Store> store, const StoreLoss& loss,
                  const Clock& clock);

  // The round whose failures this node acks and settles from now on, and its node count.
  void enter_round(int64_t round, int64_t nodes);
  // This node leaves (begin_leaving()): it acks no failure from now on, since its own leaving
  // fails the others' workers, and its count would make that a failure that spends the budget.
  void begin_leaving();
  // This node saw the round's failure (once per round): counts it in round/<r>/acks, and the
  // node that completes the count (every node alive) fixes the verdict "charged". Throws
  // ConnectionError once the store is lost, else the store's errors.
  void ack();
  // Writes `round`'s verdict through `store` if none is there yet; true when this call wrote
  // it. "C" (charged) also counts the restart job-wide; "L|<reason>" makes it free.
  bool write(Store& store, int64_t round, const std::string& verdict);
  // Blocks until the running round's verdict is known (RendezvousHandler::settle_failure).
  FailureVerdict settle();
  // Whether the running round's verdict, as it is now, says a node was lost (or left). One
  // store round trip, no ack, no wait; throws the store's errors.
  bool node_lost_now();

 private:
  std::string round_key(int64_t round, const std::string& suffix) const;
  // One look: acks, charges once past `deadline`, and waits a slice for the verdict; nullopt
  // while there is none.
  std::optional<FailureVerdict> look(int64_t round, TimePoint deadline, bool& acked);

  Settings settings_;
  std::shared_ptr<Store> store_;
  const StoreLoss& loss_;
  const Clock& clock_;

  std::mutex mutex_;
  int64_t round_ = -1;
  int64_t nodes_ = 0;
  bool leaving_ = false;
  int64_t acked_round_ = -1;
  std::mutex verdict_mutex_;    // write's tries, one at a time
  int64_t verdict_round_ = -1;  // the last round whose verdict this node wrote
};

}  // namespace dlaunch
