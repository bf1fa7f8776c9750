#include "rendezvous/handlers/static_rendezvous.h"

#include <fmt/format.h>

#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/tcp/host_port.h"
#include "rendezvous/tcp/job_token.h"
#include "rendezvous/store/prefix_store.h"
#include "rendezvous/store/store_table.h"
#include "rendezvous/handlers/round_table.h"
#include "rendezvous/tcp/wait_notes.h"
#include "rendezvous/tcp/default_ports.h"
#include "rendezvous/handlers/version_mix.h"
#include "rendezvous/tcp/worker_namespace.h"

namespace dlaunch {

namespace {
// round/<r>/all: the completing node wrote round/<r>/table ("2") or round/<r>/error ("error");
// an older build writes "1" and nothing else (every node then reads all records).
const std::string kAllWithTable = "2";
const std::string kAllWithError = "error";
}  // namespace

StaticRendezvous::StaticRendezvous(const RendezvousParams& params)
    : params_(params),
      config_(RendezvousConfig::parse(params.config)),
      clock_(params.clock ? *params.clock : steady_clock()) {
  if (params_.min_nodes != params_.max_nodes) {
    throw UsageError(fmt::format(
        "static rendezvous needs a fixed node count, got --nnodes {}:{}; use --rdzv_backend "
        "c10d for an elastic range",
        params_.min_nodes, params_.max_nodes));
  }
  if (!params_.node_rank) {
    throw UsageError("static rendezvous needs --node_rank (or SLURM_NODEID) on every node");
  }
  if (*params_.node_rank < 0 || *params_.node_rank >= params_.max_nodes) {
    throw UsageError(fmt::format("--node_rank {} is outside 0..{} for --nnodes {}",
                                 *params_.node_rank, params_.max_nodes - 1, params_.max_nodes));
  }
  node_id_ = detail::make_node_id(params_.host);
  store_ = detail::connect_store(params_, config_);
  watcher_ = std::make_unique<EventWatcher>(detail::store_opener(params_, config_, store_),
                                            prefix_, node_id_, std::chrono::seconds(1));
}

StaticRendezvous::~StaticRendezvous() { shutdown(); }

Bytes StaticRendezvous::encode(const Record& r) const {
  return to_bytes("rank=" + std::to_string(r.rank) + "\nnnodes=" + std::to_string(r.nnodes) +
                  "\nlws=" + std::to_string(r.local_world_size) + "\nrun_id=" + r.run_id +
                  "\nhost=" + r.host + "\nid=" + r.id +
                  // Older agents skip keys they do not know.
                  (r.version.empty() ? "" : "\nversion=" + r.version));
}

StaticRendezvous::Record StaticRendezvous::decode(const Bytes& b) {
  Record r;
  std::istringstream in(to_string(b));
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    try {
      if (k == "rank") r.rank = std::stoll(v);
      if (k == "nnodes") r.nnodes = std::stoll(v);
      if (k == "lws") r.local_world_size = std::stoll(v);
    } catch (const std::exception&) {
      throw ProtocolError(
          fmt::format("static rendezvous: malformed node record '{}'", to_string(b)));
    }
    if (k == "run_id") r.run_id = v;
    if (k == "host") r.host = v;
    if (k == "id") r.id = v;
    if (k == "version") r.version = v;
  }
  return r;
}

std::string StaticRendezvous::node_key(int64_t round, int64_t rank) const {
  return prefix_ + "/round/" + std::to_string(round) + "/node/" + std::to_string(rank);
}

namespace {

// "host (pid N)" from a record's node id "<host>-<pid>-<random>": two agents on one host (a
// copied command line) differ by pid only.
template <typename R>
std::string agent(const R& r) {
  size_t last = r.id.rfind('-');
  size_t pid =
      last == std::string::npos || last == 0 ? std::string::npos : r.id.rfind('-', last - 1);
  if (pid == std::string::npos) return r.host;
  return fmt::format("{} (pid {})", r.host, r.id.substr(pid + 1, last - pid - 1));
}

template <typename V>
std::string describe(const char* what, const std::string& host, const V& value) {
  return fmt::format("{} {} on {}", what, value, host);
}

// One message for a mismatch between two records, or "".
template <typename R>
std::string mismatch(const R& a, const R& b) {
  if (a.run_id != b.run_id) {
    return fmt::format(
        "two jobs share one store: {} vs {}; give each job its own --master_port (or the same "
        "--rdzv_id on every node)",
        describe("run id", a.host, fmt::format("'{}'", a.run_id)),
        describe("run id", b.host, fmt::format("'{}'", b.run_id)));
  }
  if (a.nnodes != b.nnodes) {
    return fmt::format(
        "nodes disagree on the node count: {} (node rank {}) vs {} (node rank {}); pass the "
        "same --nnodes to every node",
        describe("--nnodes", a.host, a.nnodes), a.rank, describe("--nnodes", b.host, b.nnodes),
        b.rank);
  }
  return "";
}

}  // namespace

std::string StaticRendezvous::find_conflict(int64_t round, const Record& mine) {
  for (int64_t k = 0; k < params_.max_nodes; ++k) {
    std::string key = node_key(round, k);
    if (!store_->check({key})) continue;
    Record other = decode(store_->get(key));
    std::string m = mismatch(mine, other);
    if (!m.empty()) return m;
  }
  return "";
}

void StaticRendezvous::fail_conflict(int64_t round, const std::string& message) {
  // Tell the nodes that cannot see the conflict themselves (they wait for ranks that never
  // come): the message, then "all", which wakes each at once and brings the message along
  // (release_keys). This node may host the store and exit right after; a node that learnt
  // only that the store went away would exit 1, "try again", not 78. A round that was
  // released already (a stray agent claiming a rank) keeps its table.
  const std::string round_prefix = prefix_ + "/round/" + std::to_string(round);
  store_->compare_set(round_prefix + "/error", Bytes(), to_bytes(message));
  store_->compare_set(round_prefix + "/all", Bytes(), to_bytes(kAllWithError));
  throw NodeMismatchError(fmt::format("static rendezvous failed: {}", message));
}

RendezvousResult StaticRendezvous::next_rendezvous() {
  const int64_t n = params_.max_nodes;
  const int64_t me = *params_.node_rank;
  const int64_t round = next_round_++;
  Record mine{me, n, params_.local_world_size, params_.run_id, params_.host, node_id_,
              params_.version};
  Bytes mine_bytes = encode(mine);
  auto start = clock_.now();
  auto deadline = start + config_.join_timeout;

  Bytes current = store_->compare_set(node_key(round, me), Bytes(), mine_bytes);
  if (current != mine_bytes) {
    Record other = decode(current);
    std::string m = mismatch(mine, other);
    if (m.empty()) {
      m = fmt::format(
          "node rank {} is claimed by two agents: {} and {} (run id '{}'); give every node a "
          "distinct --node_rank in 0..{}",
          me, agent(other), agent(mine), mine.run_id, n - 1);
    }
    fail_conflict(round, m);
  }

  std::vector<std::string> keys;
  for (int64_t k = 0; k < n; ++k) keys.push_back(node_key(round, k));
  // Count arrivals; the node that completes the count sets one key everybody waits on, so a
  // WAIT names one key instead of N (N agents x N keys is what makes 1,000 agents slow).
  std::string round_prefix = prefix_ + "/round/" + std::to_string(round);
  std::string all_key = round_prefix + "/all";
  const int64_t joined_at_arrival = store_->add(round_prefix + "/joined", 1);
  note_joined(fmt::format("{} of --nnodes {} nodes joined", joined_at_arrival, n));
  if (joined_at_arrival == n) {
    // This node completed the count: it checks every record against its own once and writes
    // the round's table, so the others read one key instead of all N.
    close_round(round, mine, keys, deadline);
  }
  std::string error_key = round_prefix + "/error";
  const std::vector<std::string> release = release_keys(round);
  Duration slice = std::chrono::seconds(1);
  // Node 0 (usually the store's host) reads the count for its notes; the others do not, so
  // that a large job's round makes no more requests for it.
  WaitNotes notes(start);
  WaitGetResult released;
  while (true) {
    auto now = clock_.now();
    if (now >= deadline) throw_join_timeout(keys);
    if (notes.due(now)) {
      std::string joined = fmt::format("this is node {} of {}", me, n);
      if (me == 0) {
        const int64_t count = store_->add(round_prefix + "/joined", 0);
        joined = fmt::format("{} of {} nodes joined", count, n);
        note_joined(fmt::format("{} of --nnodes {} nodes joined", count, n));
      }
      log_info("static rendezvous: waiting for the other nodes ({}) {}; every node needs "
               "--nnodes {} and --master_addr/--master_port {}",
               joined, notes.how_long(now, config_.join_timeout), n, params_.endpoint);
    }
    // One request brings what the node needs after the release: N agents woken by one round
    // each read nothing more (the store's WAIT_GET; see Store::wait_get for older hosts).
    released = store_->wait_get(release, std::min<Duration>(slice, deadline - now));
    if (released.ready) break;
    if (store_->check({error_key})) {
      throw NodeMismatchError(
          fmt::format("static rendezvous failed: {}", to_string(store_->get(error_key))));
    }
    if (me == 0) {
      std::string m = find_conflict(round, mine);
      if (!m.empty()) fail_conflict(round, m);
    }
    slice = std::min<Duration>(slice * 2, std::chrono::seconds(30));
  }

  note_joined("");
  return read_result(round, mine, keys, deadline, released.values);
}

std::vector<std::string> StaticRendezvous::release_keys(int64_t round) const {
  const std::string round_prefix = prefix_ + "/round/" + std::to_string(round);
  return {round_prefix + "/all", round_prefix + "/table", prefix_ + "/restart_count",
          round_prefix + "/error"};
}

RendezvousResult StaticRendezvous::read_result(int64_t round, const Record& mine,
                                               const std::vector<std::string>& keys,
                                               TimePoint deadline,
                                               const std::vector<std::optional<Bytes>>& released) {
  const int64_t n = static_cast<int64_t>(keys.size());
  const int64_t me = mine.rank;
  const std::string round_prefix = prefix_ + "/round/" + std::to_string(round);
  const std::string error_key = round_prefix + "/error";
  RendezvousResult result;
  result.round = round;
  result.group_rank = me;
  result.group_world_size = n;
  std::vector<std::pair<std::string, std::string>> builds;
  const Bytes all = released.at(0).value_or(Bytes());
  if (all == to_bytes(kAllWithError)) {
    // Set before "all", so fetched with it (an older closer's release brings no fourth key).
    const Bytes why = released.size() > 3 && released[3] ? *released[3] : store_->get(error_key);
    throw NodeMismatchError(fmt::format("static rendezvous failed: {}", to_string(why)));
  }
  if (all == to_bytes(kAllWithTable)) {
    // The closer writes the table before it sets "all", so the WAIT_GET fetched it with "all".
    RoundTable table = RoundTable::decode(
        released.at(1) ? *released.at(1) : store_->get(round_prefix + "/table"));
    if (table.participants != n) {
      throw ProtocolError(fmt::format(
          "static rendezvous: the round's table lists {} nodes, this node expects --nnodes {}; "
          "the store holds records of another job",
          table.participants, n));
    }
    result.local_world_sizes = table.local_world_sizes();
    result.hosts = table.hosts;
    if (result.hosts.empty()) {  // a large round lists no hosts (round_table.h)
      result.hosts.assign(n, "");
      result.hosts[me] = params_.host;
    }
    builds = table.host_builds();
    return finish(round, std::move(result), builds, released.at(2));
  }
  // Completed by an agent of an older build, which writes no table: read every record.
  // "all" means the count reached some node's --nnodes; with disagreeing counts some of our
  // ranks may never come. Check what is there before blocking on it.
  if (!store_->check(keys)) {
    std::string m = find_conflict(round, mine);
    if (!m.empty()) fail_conflict(round, m);
    auto left = deadline - clock_.now();
    store_->wait(keys, std::max<Duration>(left, std::chrono::milliseconds(1)));
  }
  auto values = store_->multi_get(keys);
  for (int64_t k = 0; k < n; ++k) {
    Record r = decode(values[k]);
    std::string m = mismatch(mine, r);
    if (!m.empty()) fail_conflict(round, m);
    result.local_world_sizes.push_back(r.local_world_size);
    result.hosts.push_back(r.host);
    builds.emplace_back(r.host, r.version);
  }
  return finish(round, std::move(result), builds, released.at(2));
}

void StaticRendezvous::throw_join_timeout(const std::vector<std::string>& keys) {
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<int64_t> missing;
  std::string joined;
  for (int64_t k = 0; k < n; ++k) {
    if (!store_->check({keys[k]})) {
      missing.push_back(k);
    } else if (joined.size() < 400) {
      joined += fmt::format("{}{} on {}", joined.empty() ? "" : ", ", k,
                            decode(store_->get(keys[k])).host);
    }
  }
  std::string m;
  for (size_t i = 0; i < missing.size() && i < 20; ++i) {
    m += fmt::format("{}{}", i ? ", " : "", missing[i]);
  }
  if (missing.size() > 20) m += ", ...";
  const int64_t refused = job_token_refusals();
  std::string refused_hint;
  if (refused > 0) {
    refused_hint = fmt::format(
        "; this node's store refused {} client(s) for a job token that differs from its own",
        refused);
  }
  throw TimeoutError(fmt::format(
      "static rendezvous: after {:g} s (join_timeout) {} of {} nodes never joined (missing node "
      "ranks: {}; joined: {}{}); check that every node runs dlaunch with --nnodes {}, a distinct "
      "--node_rank and the same --master_addr/--master_port ({}){}",
      to_seconds(config_.join_timeout), missing.size(), n, m, joined, refused_hint, n,
      params_.endpoint, refused > 0 ? ", and give every node the same DLAUNCH_JOB_TOKEN" : ""));
}

void StaticRendezvous::close_round(int64_t round, const Record& mine,
                                   const std::vector<std::string>& keys, TimePoint deadline) {
  const std::string round_prefix = prefix_ + "/round/" + std::to_string(round);
  const std::string all_key = round_prefix + "/all";
  // The count reached this node's --nnodes; with disagreeing counts some ranks never come.
  if (!store_->check(keys)) {
    std::string m = find_conflict(round, mine);
    if (!m.empty()) {
      store_->compare_set(round_prefix + "/error", Bytes(), to_bytes(m));
      store_->set(all_key, to_bytes(kAllWithError));
      fail_conflict(round, m);
    }
    try {
      store_->wait(keys, std::max<Duration>(deadline - clock_.now(), std::chrono::milliseconds(1)));
    } catch (const TimeoutError&) {
      return;  // not released: the wait for "all" names the missing ranks at the deadline
    }
  }
  std::vector<NodeDescriptor> nodes;
  std::vector<size_t> by_rank;
  for (const auto& v : store_->multi_get(keys)) {
    Record r = decode(v);
    std::string m = mismatch(mine, r);
    if (!m.empty()) {
      // Every node would find this pair or one like it: tell them all at once.
      store_->compare_set(round_prefix + "/error", Bytes(), to_bytes(m));
      store_->set(all_key, to_bytes(kAllWithError));
      fail_conflict(round, m);
    }
    NodeDescriptor d{r.id, r.host, r.local_world_size, r.rank};
    d.version = r.version;
    by_rank.push_back(nodes.size());
    nodes.push_back(std::move(d));
  }
  // Before anyone is released, every worker of this round gets a namespace of its own, and the
  // previous round's keys go (every node stopped its workers before joining). PyTorch 1.13's
  // workers put TORCHELASTIC_RESTART_COUNT in their keys; 2.x's do not (torchrun 2.x gives each
  // restart a store of its own), so without it a restarted 2.x group reads the failed group's
  // gloo addresses and cannot connect.
  begin_worker_namespace(*store_, worker_namespace(params_.run_id, round));
  store_->set(round_prefix + "/table", RoundTable::make(nodes, by_rank).encode());
  store_->set(all_key, to_bytes(kAllWithTable));
}

RendezvousResult StaticRendezvous::finish(int64_t round, RendezvousResult result,
                                          const std::vector<std::pair<std::string, std::string>>&
                                              builds,
                                          const std::optional<Bytes>& restart_count) {
  const int64_t me = result.group_rank, n = result.group_world_size;
  std::string mix = describe_version_mix(params_.version, builds);
  if (!mix.empty() && !version_mix_warned_) {
    log_warning("{}", mix);
    version_mix_warned_ = true;
  }
  HostPort master = parse_host_port(params_.endpoint.empty() ? "127.0.0.1" : params_.endpoint,
                                    kDefaultMasterPort, "--master_addr/--master_port");
  result.master_addr = master.host;
  result.master_port = master.port;
  const std::string restart_key = prefix_ + "/restart_count";
  result.restart_count = restart_count ? parse_counter(*restart_count, restart_key) : 0;
  result.store = std::make_shared<PrefixStore>("dlaunch/job/" + params_.run_id, store_);
  current_round_ = round;
  log_info("static rendezvous round {} complete: node rank {} of {}, world size {}", round, me, n,
           result.world_size());
  return result;
}

void StaticRendezvous::watch(std::function<void(const RendezvousEvent&)> on_event) {
  DL_CHECK(current_round_ >= 0) << "watch() before next_rendezvous()";
  watcher_->watch(current_round_, std::move(on_event));
}

void StaticRendezvous::request_restart(const std::string& report) {
  DL_CHECK(current_round_ >= 0) << "request_restart() before next_rendezvous()";
  EventRecord e{RendezvousEvent::Kind::kRestartRequested, node_id_, report};
  if (publish_event(*store_, prefix_, current_round_, e)) store_->add(prefix_ + "/restart_count", 1);
}

void StaticRendezvous::set_closed() {
  store_->set(prefix_ + "/closed", to_bytes("1"));
  if (current_round_ >= 0) {
    publish_event(*store_, prefix_, current_round_,
                  {RendezvousEvent::Kind::kShutdownRequested, node_id_, "rendezvous closed"});
  }
}

bool StaticRendezvous::is_closed() { return store_->check({prefix_ + "/closed"}); }

void StaticRendezvous::shutdown() {
  if (watcher_) watcher_->stop();
}

}  // namespace dlaunch
