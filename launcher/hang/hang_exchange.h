// Which rank of the whole job is stuck, when the hang spans nodes. Each agent judges only its
// own workers (hang_investigation.h): when the stuck rank is on node B, node A's ranks all wait
// in a collective for it and, alone, node A could only name one of its own victims. So every
// node that saw a hang writes its verdict into the job's store, and a node whose silent ranks
// all wait in a collective reads the others' for a moment and names the rank stuck elsewhere.
//
//   key        hang/<round>/<node rank> in the job's store (status_keys.h's
//              job_store_prefix; the TCP store or etcd), one JSON verdict per node
//   stuck here write the verdict, done (one store round trip): the others find it
//   victims    write the verdict, then read the other nodes' keys every 50 ms until one names a
//              stuck rank or kHangExchangeWait passed (then the local verdict stands)
//
// Threads: exchange_hang_verdicts() blocks (run it off the loop); start_hang_exchange() runs it
// on a detached helper thread and hands the answer back through `post` (the agent's loop).
// Store errors are logged and end the exchange with no remote root: naming a victim is better
// than holding up supervision.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "launcher/hang/hang_investigation.h"

namespace dlaunch {

class Store;

// How long a node whose ranks only wait reads the others' verdicts: the stuck rank's node
// captures its stacks at about the same time (its rank went silent first), so its verdict is
// there by then or comes soon after.
inline constexpr Duration kHangExchangeWait = std::chrono::seconds(1);

struct NodeHangVerdict {
  int64_t node_rank = 0;
  std::string host;
  // A silent rank here is stuck outside a collective (or stopped): the root cause of the hang.
  // False when every silent rank here waits in a collective, or no stack could be read.
  bool stuck_here = false;
  // The rank this node names (the stuck one, or its first victim).
  int64_t rank = -1;
  int64_t local_rank = -1;
  int pid = 0;
  std::string where;         // "wait_for_a_batch (train.py:22)"
  std::string python_stack;  // its main thread's Python frames, as the report prints them
  std::string stacks_dir;    // where its stack.txt / py_stack.txt are, on that node
  // The stuck rank announced rank_recovery and its agent replaces single ranks: that node will
  // most likely replace it alone (or else restart the job, which the others hear as a peer's
  // restart), so the silent ranks elsewhere wait for the re-formed group instead of restarting.
  bool replaceable = false;
};

// This node's verdict from judge_hang's: stuck here when its root was stopped or its stacks
// show it outside a collective.
NodeHangVerdict node_hang_verdict(const HangVerdict& v, int64_t node_rank, const std::string& host,
                                  int64_t global_rank, int pid, const std::string& stacks_dir);

std::string encode_hang_verdict(const NodeHangVerdict& v);
// nullopt for text that is not a verdict.
std::optional<NodeHangVerdict> decode_hang_verdict(const std::string& text);

// The verdict naming the job's stuck rank when it is not here: nullopt when `mine` is stuck
// here itself, else the first of `others` (lowest node rank) that is stuck there. Pure.
std::optional<NodeHangVerdict> pick_remote_hang_root(const NodeHangVerdict& mine,
                                                     const std::vector<NodeHangVerdict>& others);

// The store key of one node's verdict.
std::string hang_verdict_key(int64_t round, int64_t node_rank);

struct HangExchangeRequest {
  int64_t round = 0;  // job-wide, new at every restart: one hang per round
  int64_t nodes = 1;  // nodes of the round; node ranks 0 .. nodes-1
  NodeHangVerdict mine;
  Duration wait = kHangExchangeWait;
};

// Writes `mine`; when it is not stuck here, reads the others' until one is or `wait` passed.
// Returns the remote root (pick_remote_hang_root). Blocks; throws the store's errors.
std::optional<NodeHangVerdict> exchange_hang_verdicts(Store& job_store,
                                                      const HangExchangeRequest& request);

// exchange_hang_verdicts on a detached thread; `done` runs through `post` (never on the calling
// thread), with nullopt when the store failed (logged). With no store or a single node, `done`
// is posted at once.
void start_hang_exchange(std::shared_ptr<Store> job_store, HangExchangeRequest request,
                         std::function<void(std::function<void()>)> post,
                         std::function<void(std::optional<NodeHangVerdict>)> done);

// "rank 1 on node 1 (host-b, local rank 0, pid 4242), stuck in f (train.py:22)".
std::string describe_remote_hang_root(const NodeHangVerdict& root);

}  // namespace dlaunch
