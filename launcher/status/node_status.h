// What one agent reports about itself and its workers: the model behind GET /status (JSON) and
// GET /metrics (Prometheus text exposition), and what `dlaunch status` reads back from every
// agent of a job (job_control.h). Building the model from the agent's state, formatting it and
// parsing it back are pure functions here; the agent fills it on its loop thread
// (agent_monitor.h), the status server only sends it.
//
// Also the /proc reader for a process's resident memory and CPU time (Linux only; a process
// that is gone, or a field that cannot be read, leaves the value unset, never throws).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "rendezvous/tcp/store_stats.h"

namespace dlaunch {

struct ProcUsage {
  int64_t rss_bytes = 0;
  double cpu_seconds = 0;  // user + system, this process only (not its reaped children)
  int64_t threads = 0;
};
// /proc/<pid>/stat: nullopt when the process is gone or the file does not parse.
std::optional<ProcUsage> read_proc_usage(int pid);

struct WorkerStatus {
  int64_t global_rank = 0;
  int64_t local_rank = 0;
  int pid = -1;
  // "init", "running", "succeeded", "failed", "hung", "stopped" (worker_status() below).
  std::string state;
  double start_time = 0;  // Unix seconds; 0: not started
  int64_t restarts = 0;   // of the worker group so far (TORCHELASTIC_RESTART_COUNT)
  // Times this rank was replaced alone in the current attempt (--restart_scope rank).
  int64_t replacements = 0;
  std::optional<double> heartbeat_age_seconds;  // nullopt: never beat (or no heartbeat file)
  std::optional<int> exit_code;                 // exited normally with this code
  std::optional<int> exit_signal;               // killed by this signal
  std::optional<ProcUsage> usage;               // while running
  std::string log_dir;  // the rank's directory (py_stack.txt for `dump`); not in the JSON
};

struct NodeStatus {
  std::string run_id;
  std::string host;  // the node's name (DLAUNCH_NODE_ID)
  // --local_addr when given: tells apart the nodes of one host (all of them `host`).
  std::string local_addr;
  int agent_pid = 0;
  std::string phase;       // "rendezvous", "running", "capturing", "stopping", ...
  // While waiting at the rendezvous, what this node last saw: "1 of 2 nodes joined"; empty
  // when it knows nothing yet or does not wait there.
  std::string rendezvous_joined;
  int64_t attempt = -1;    // DLAUNCH_ATTEMPT of the current generation; -1 before the first
  int64_t round = -1;      // the rendezvous round
  int64_t node_rank = -1;  // GROUP_RANK
  int64_t nnodes = 0;      // GROUP_WORLD_SIZE
  int64_t world_size = 0;
  int64_t restarts = 0;  // job-wide restart count of the round
  int64_t max_restarts = 0;
  double agent_start_time = 0;  // Unix seconds
  std::string events_file;      // this agent's timeline (job_events.h)
  std::optional<ProcUsage> agent_usage;
  std::vector<WorkerStatus> workers;
  std::optional<StoreStatsSnapshot> store;  // when this agent hosts the job's store
};

struct WorkerRecord;
// One worker's line, from the group's record; `last_beat`: when its heartbeat file was last
// touched (nullopt: never). Reads /proc for a running worker.
WorkerStatus worker_status(const WorkerRecord& w, int64_t restarts, TimePoint now,
                           std::optional<TimePoint> last_beat);

nlohmann::json node_status_json(const NodeStatus& s);
// Throws nlohmann::json::exception on a document that is not a NodeStatus.
NodeStatus node_status_from_json(const nlohmann::json& j);

// Prometheus text exposition format 0.0.4: HELP and TYPE lines, base units (seconds, bytes),
// labels run_id, node (host) and node_rank on every series, rank and local_rank on per-worker
// ones.
std::string to_prometheus(const NodeStatus& s);

// "vm (127.0.0.2)" for a node given --local_addr other than its host name; else "vm".
std::string host_and_address(const std::string& host, const std::string& local_addr);

}  // namespace dlaunch
