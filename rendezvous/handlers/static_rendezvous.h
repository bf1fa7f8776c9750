// Static rendezvous: --nnodes N --node_rank K --master_addr A --master_port P. The node-0 agent
// hosts the store; every node claims its rank for the round with compare_set and waits for the
// other N-1. Rounds count the agent's calls to next_rendezvous() (every node restarts together,
// pushed by the restart event), so round r of one node meets round r of the others.
//
// Conflicts fail within the join timeout with one StateError naming the hosts and values: two
// agents with one node rank, different --nnodes, different run ids. Node 0 checks what has
// arrived at growing intervals and publishes a conflict for nodes that could not see it
// themselves. A master that never answers is a ConnectionError (from the store connect).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/handlers/rendezvous_events.h"
#include "rendezvous/handlers/rendezvous_registry.h"

namespace dlaunch {

class StaticRendezvous final : public RendezvousHandler {
 public:
  // Connects to the store (or uses params.store); throws UsageError for missing or out-of-range
  // node rank, ConnectionError when the master does not answer within the join timeout.
  explicit StaticRendezvous(const RendezvousParams& params);
  ~StaticRendezvous() override;

  std::string backend() const override { return "static"; }
  std::string run_id() const override { return params_.run_id; }
  RendezvousResult next_rendezvous() override;
  void watch(std::function<void(const RendezvousEvent&)> on_event) override;
  void prepare_watch() override { watcher_->prepare(); }
  void request_restart(const std::string& report) override;
  int64_t num_nodes_waiting() override { return 0; }
  void set_closed() override;
  bool is_closed() override;
  void shutdown() override;

 private:
  struct Record {
    int64_t rank = -1, nnodes = 0, local_world_size = 0;
    std::string run_id, host, id;
    std::string version;  // the agent's build; empty from agents older than version publishing
  };
  Bytes encode(const Record& r) const;
  static Record decode(const Bytes& b);
  std::string node_key(int64_t round, int64_t rank) const;
  // Node 0 only: compares what has arrived; returns a conflict message or "".
  std::string find_conflict(int64_t round, const Record& mine);
  [[noreturn]] void fail_conflict(int64_t round, const std::string& message);
  // The node whose arrival completed the count: checks every record against its own, then
  // writes the round's table (rendezvous/handlers/round_table.h) or the conflict, and releases "all".
  void close_round(int64_t round, const Record& mine, const std::vector<std::string>& keys,
                   TimePoint deadline);
  // After "all" was set: the round's table (or every record, from an older closer) read into
  // the result. `released`: "all", the table, the restart count and the conflict message as
  // the release's WAIT_GET fetched them (release_keys), so a node reads nothing more after it
  // is woken.
  RendezvousResult read_result(int64_t round, const Record& mine,
                               const std::vector<std::string>& keys, TimePoint deadline,
                               const std::vector<std::optional<Bytes>>& released);
  // What the release's WAIT_GET waits for (the first) and fetches with it.
  std::vector<std::string> release_keys(int64_t round) const;
  // The join timeout passed: which ranks joined and which never did, and what to check.
  [[noreturn]] void throw_join_timeout(const std::vector<std::string>& keys);
  // The result's common part: version mix, master, store; the restart count as fetched.
  RendezvousResult finish(int64_t round, RendezvousResult result,
                          const std::vector<std::pair<std::string, std::string>>& builds,
                          const std::optional<Bytes>& restart_count);

  RendezvousParams params_;
  RendezvousConfig config_;
  const Clock& clock_;
  std::shared_ptr<Store> store_;
  std::string prefix_ = "dlaunch/static";
  std::string node_id_;
  int64_t next_round_ = 0;
  int64_t current_round_ = -1;
  std::unique_ptr<EventWatcher> watcher_;
  bool version_mix_warned_ = false;  // once per agent, not every round (next_rendezvous' thread)
};

}  // namespace dlaunch
