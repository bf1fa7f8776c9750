#include "launcher/status/node_status.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launcher/process/worker_group.h"

namespace dlaunch {

std::optional<ProcUsage> read_proc_usage(int pid) {
  if (pid <= 0) return std::nullopt;
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  // The command name (field 2) may hold spaces and parentheses: fields start after the last ')'.
  size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(line.substr(close + 2));
  std::vector<std::string> f;
  std::string tok;
  while (fields >> tok) f.push_back(tok);
  // Field 3 (state) is f[0]; utime 14 -> f[11], stime 15 -> f[12], num_threads 20 -> f[17],
  // rss 24 -> f[21] (pages).
  if (f.size() < 22) return std::nullopt;
  try {
    static const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
    static const int64_t page = ::sysconf(_SC_PAGESIZE);
    ProcUsage u;
    u.cpu_seconds = static_cast<double>(std::stoll(f[11]) + std::stoll(f[12])) / ticks;
    u.threads = std::stoll(f[17]);
    u.rss_bytes = std::stoll(f[21]) * page;
    return u;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

namespace {

nlohmann::json usage_json(const std::optional<ProcUsage>& u) {
  if (!u) return nullptr;
  return {{"rss_bytes", u->rss_bytes}, {"cpu_seconds", u->cpu_seconds}, {"threads", u->threads}};
}

std::optional<ProcUsage> usage_from(const nlohmann::json& j) {
  if (j.is_null()) return std::nullopt;
  ProcUsage u;
  u.rss_bytes = j.value("rss_bytes", int64_t{0});
  u.cpu_seconds = j.value("cpu_seconds", 0.0);
  u.threads = j.value("threads", int64_t{0});
  return u;
}

template <typename T>
nlohmann::json opt(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

template <typename T>
std::optional<T> opt_from(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return it->get<T>();
}

// Label values escape backslash, double quote and newline (exposition format).
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

class Exposition {
 public:
  explicit Exposition(std::string node_labels) : node_labels_(std::move(node_labels)) {}
  void family(const char* name, const char* type, const char* help) {
    text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(const std::string& name, double value, const std::string& extra = "") {
    text_ += fmt::format("{}{{{}{}}} {}\n", name, node_labels_, extra, format(value));
  }
  std::string take() { return std::move(text_); }

 private:
  static std::string format(double v) {
    if (v == static_cast<double>(static_cast<int64_t>(v)) && std::abs(v) < 1e15) {
      return std::to_string(static_cast<int64_t>(v));
    }
    return fmt::format("{}", v);
  }
  std::string node_labels_;
  std::string text_;
};

}  // namespace

WorkerStatus worker_status(const WorkerRecord& w, int64_t restarts, TimePoint now,
                           std::optional<TimePoint> last_beat) {
  WorkerStatus s;
  s.global_rank = w.global_rank;
  s.local_rank = w.local_rank;
  s.pid = w.pid;
  s.log_dir = w.log_dir;
  switch (w.state) {
    case WorkerState::kInit:
      s.state = "init";
      break;
    case WorkerState::kRunning:
      s.state = "running";
      break;
    case WorkerState::kSucceeded:
      s.state = "succeeded";
      break;
    case WorkerState::kFailed:
      s.state = "failed";
      break;
    case WorkerState::kStopped:
      s.state = "stopped";
      break;
  }
  if (w.hung) s.state = w.state == WorkerState::kRunning ? "hung" : s.state + " (hung)";
  if (w.pid > 0)
    s.start_time = std::chrono::duration<double>(w.started_wall.time_since_epoch()).count();
  s.restarts = restarts;
  s.replacements = w.replacements;
  if (last_beat && w.state == WorkerState::kRunning)
    s.heartbeat_age_seconds = to_seconds(now - *last_beat);
  if (w.exit) {
    if (w.exit->signaled) {
      s.exit_signal = w.exit->code;
    } else {
      s.exit_code = w.exit->code;
    }
  }
  if (w.running()) s.usage = read_proc_usage(w.pid);
  return s;
}

nlohmann::json node_status_json(const NodeStatus& s) {
  nlohmann::json j;
  j["run_id"] = s.run_id;
  j["host"] = s.host;
  j["local_addr"] = s.local_addr;
  j["agent_pid"] = s.agent_pid;
  j["phase"] = s.phase;
  j["rendezvous_joined"] = s.rendezvous_joined;
  j["attempt"] = s.attempt;
  j["round"] = s.round;
  j["node_rank"] = s.node_rank;
  j["nnodes"] = s.nnodes;
  j["world_size"] = s.world_size;
  j["restarts"] = s.restarts;
  j["max_restarts"] = s.max_restarts;
  j["agent_start_time"] = s.agent_start_time;
  j["events_file"] = s.events_file;
  j["agent"] = usage_json(s.agent_usage);
  j["workers"] = nlohmann::json::array();
  for (const auto& w : s.workers) {
    j["workers"].push_back({{"rank", w.global_rank},
                            {"local_rank", w.local_rank},
                            {"pid", w.pid},
                            {"state", w.state},
                            {"start_time", w.start_time},
                            {"restarts", w.restarts},
                            {"replacements", w.replacements},
                            {"heartbeat_age_seconds", opt(w.heartbeat_age_seconds)},
                            {"exit_code", opt(w.exit_code)},
                            {"exit_signal", opt(w.exit_signal)},
                            {"usage", usage_json(w.usage)}});
  }
  if (s.store) {
    const auto& st = *s.store;
    j["store"] = {{"keys", st.keys},
                  {"connections", st.connections},
                  {"connections_peak", st.connections_peak},
                  {"connections_accepted", st.connections_accepted},
                  {"channels_opened", st.channels_opened},
                  {"requests", st.requests},
                  {"requests_per_second", st.requests_per_s},
                  {"latency_p50_seconds", st.p50_seconds},
                  {"latency_p99_seconds", st.p99_seconds},
                  {"requests_by_op",
                   {{"agents", st.agent_requests_by_op}, {"workers", st.worker_requests_by_op}}}};
  } else {
    j["store"] = nullptr;
  }
  return j;
}

NodeStatus node_status_from_json(const nlohmann::json& j) {
  NodeStatus s;
  s.run_id = j.at("run_id").get<std::string>();
  s.host = j.at("host").get<std::string>();
  s.agent_pid = j.value("agent_pid", 0);
  s.local_addr = j.value("local_addr", std::string());
  s.phase = j.at("phase").get<std::string>();
  s.rendezvous_joined = j.value("rendezvous_joined", std::string());
  s.attempt = j.value("attempt", int64_t{-1});
  s.round = j.value("round", int64_t{-1});
  s.node_rank = j.value("node_rank", int64_t{-1});
  s.nnodes = j.value("nnodes", int64_t{0});
  s.world_size = j.value("world_size", int64_t{0});
  s.restarts = j.value("restarts", int64_t{0});
  s.max_restarts = j.value("max_restarts", int64_t{0});
  s.agent_start_time = j.value("agent_start_time", 0.0);
  s.events_file = j.value("events_file", std::string());
  if (j.contains("agent")) s.agent_usage = usage_from(j["agent"]);
  for (const auto& w : j.at("workers")) {
    WorkerStatus ws;
    ws.global_rank = w.at("rank").get<int64_t>();
    ws.local_rank = w.at("local_rank").get<int64_t>();
    ws.pid = w.value("pid", -1);
    ws.state = w.at("state").get<std::string>();
    ws.start_time = w.value("start_time", 0.0);
    ws.restarts = w.value("restarts", int64_t{0});
    ws.replacements = w.value("replacements", int64_t{0});
    ws.heartbeat_age_seconds = opt_from<double>(w, "heartbeat_age_seconds");
    ws.exit_code = opt_from<int>(w, "exit_code");
    ws.exit_signal = opt_from<int>(w, "exit_signal");
    if (w.contains("usage")) ws.usage = usage_from(w["usage"]);
    s.workers.push_back(ws);
  }
  if (j.contains("store") && !j["store"].is_null()) {
    const auto& st = j["store"];
    StoreStatsSnapshot snap;
    snap.keys = st.value("keys", int64_t{0});
    snap.connections = st.value("connections", int64_t{0});
    snap.connections_peak = st.value("connections_peak", int64_t{0});
    snap.connections_accepted = st.value("connections_accepted", int64_t{0});
    snap.channels_opened = st.value("channels_opened", int64_t{0});
    snap.requests = st.value("requests", int64_t{0});
    snap.requests_per_s = st.value("requests_per_second", 0.0);
    snap.p50_seconds = st.value("latency_p50_seconds", 0.0);
    snap.p99_seconds = st.value("latency_p99_seconds", 0.0);
    if (st.contains("requests_by_op")) {
      const auto& by_op = st["requests_by_op"];
      snap.agent_requests_by_op = by_op.value("agents", std::map<std::string, int64_t>{});
      snap.worker_requests_by_op = by_op.value("workers", std::map<std::string, int64_t>{});
    }
    s.store = snap;
  }
  return s;
}

namespace {

// The node's agent: its group, round and restarts, and its own memory and CPU.
void add_agent_metrics(Exposition& e, const NodeStatus& s) {
  e.family("dlaunch_attempt", "gauge",
           "Current generation of the worker group on this node (DLAUNCH_ATTEMPT).");
  e.sample("dlaunch_attempt", static_cast<double>(s.attempt));
  e.family("dlaunch_rendezvous_round", "gauge", "Rendezvous round the node's workers belong to.");
  e.sample("dlaunch_rendezvous_round", static_cast<double>(s.round));
  e.family("dlaunch_nodes", "gauge", "Nodes in the current round (GROUP_WORLD_SIZE).");
  e.sample("dlaunch_nodes", static_cast<double>(s.nnodes));
  e.family("dlaunch_world_size", "gauge", "Workers job-wide in the current round (WORLD_SIZE).");
  e.sample("dlaunch_world_size", static_cast<double>(s.world_size));
  e.family("dlaunch_restarts_total", "counter", "Job-wide restarts of the worker groups so far.");
  e.sample("dlaunch_restarts_total", static_cast<double>(s.restarts));
  e.family("dlaunch_max_restarts", "gauge", "The restart budget (--max_restarts).");
  e.sample("dlaunch_max_restarts", static_cast<double>(s.max_restarts));
  e.family("dlaunch_agent_start_time_seconds", "gauge", "When the agent started, Unix time.");
  e.sample("dlaunch_agent_start_time_seconds", s.agent_start_time);
  if (s.agent_usage) {
    e.family("dlaunch_agent_resident_memory_bytes", "gauge", "Resident memory of the agent.");
    e.sample("dlaunch_agent_resident_memory_bytes", static_cast<double>(s.agent_usage->rss_bytes));
    e.family("dlaunch_agent_cpu_seconds_total", "counter",
             "CPU time of the agent (user + system).");
    e.sample("dlaunch_agent_cpu_seconds_total", s.agent_usage->cpu_seconds);
  }
}

// One sample per worker in each family.
void add_worker_metrics(Exposition& e, const NodeStatus& s) {
  auto worker_labels = [](const WorkerStatus& w) {
    return fmt::format(",rank=\"{}\",local_rank=\"{}\"", w.global_rank, w.local_rank);
  };
  e.family("dlaunch_worker_up", "gauge", "1 while the worker process runs, else 0.");
  for (const auto& w : s.workers)
    e.sample("dlaunch_worker_up", w.state == "running" || w.state == "hung" ? 1 : 0,
             worker_labels(w));
  e.family("dlaunch_worker_state", "gauge", "The worker's state: 1 for the label that applies.");
  for (const auto& w : s.workers) {
    e.sample("dlaunch_worker_state", 1, worker_labels(w) + fmt::format(",state=\"{}\"", w.state));
  }
  e.family("dlaunch_worker_start_time_seconds", "gauge", "When the worker started, Unix time.");
  for (const auto& w : s.workers) {
    if (w.start_time > 0)
      e.sample("dlaunch_worker_start_time_seconds", w.start_time, worker_labels(w));
  }
  e.family("dlaunch_worker_restarts_total", "counter", "Restarts of the worker's group so far.");
  for (const auto& w : s.workers) {
    e.sample("dlaunch_worker_restarts_total", static_cast<double>(w.restarts), worker_labels(w));
  }
  e.family("dlaunch_worker_heartbeat_age_seconds", "gauge",
           "Time since the worker last touched its heartbeat file (absent: never).");
  for (const auto& w : s.workers) {
    if (w.heartbeat_age_seconds) {
      e.sample("dlaunch_worker_heartbeat_age_seconds", *w.heartbeat_age_seconds, worker_labels(w));
    }
  }
  e.family("dlaunch_worker_exit_code", "gauge",
           "Exit code of an exited worker (128+N after signal N).");
  for (const auto& w : s.workers) {
    if (w.exit_code) e.sample("dlaunch_worker_exit_code", *w.exit_code, worker_labels(w));
    if (w.exit_signal) e.sample("dlaunch_worker_exit_code", 128 + *w.exit_signal, worker_labels(w));
  }
  e.family("dlaunch_worker_resident_memory_bytes", "gauge",
           "Resident memory of the worker process.");
  for (const auto& w : s.workers) {
    if (w.usage) {
      e.sample("dlaunch_worker_resident_memory_bytes", static_cast<double>(w.usage->rss_bytes),
               worker_labels(w));
    }
  }
  e.family("dlaunch_worker_cpu_seconds_total", "counter",
           "CPU time of the worker process (user + system).");
  for (const auto& w : s.workers) {
    if (w.usage)
      e.sample("dlaunch_worker_cpu_seconds_total", w.usage->cpu_seconds, worker_labels(w));
  }
}

// The job's store, on the agent that hosts it: keys, connections and the latency histogram.
void add_store_metrics(Exposition& e, const StoreStatsSnapshot& st) {
  e.family("dlaunch_store_keys", "gauge", "Keys in the job's store hosted by this agent.");
  e.sample("dlaunch_store_keys", static_cast<double>(st.keys));
  e.family("dlaunch_store_connections", "gauge", "Open connections to the job's store.");
  e.sample("dlaunch_store_connections", static_cast<double>(st.connections));
  e.family("dlaunch_store_requests_total", "counter", "Requests the job's store served.");
  e.sample("dlaunch_store_requests_total", static_cast<double>(st.requests));
  e.family("dlaunch_store_requests_by_op_total", "counter",
           "Requests the job's store served, by op and by client (agent or worker).");
  const std::pair<const char*, const std::map<std::string, int64_t>*> clients[] = {
      {"agent", &st.agent_requests_by_op}, {"worker", &st.worker_requests_by_op}};
  for (const auto& [client, by_op] : clients) {
    for (const auto& [op, n] : *by_op) {
      e.sample("dlaunch_store_requests_by_op_total", static_cast<double>(n),
               fmt::format(",client=\"{}\",op=\"{}\"", client, op));
    }
  }
  e.family("dlaunch_store_request_duration_seconds", "histogram",
           "Service time of a store request (decoded to reply queued).");
  for (size_t i = 0; i < StoreStatsSnapshot::kBuckets; ++i) {
    e.sample("dlaunch_store_request_duration_seconds_bucket",
             static_cast<double>(st.cumulative[i]),
             fmt::format(",le=\"{:g}\"", StoreStatsSnapshot::bucket_bound_seconds(i)));
  }
  e.sample("dlaunch_store_request_duration_seconds_bucket",
           static_cast<double>(st.cumulative[StoreStatsSnapshot::kBuckets]), ",le=\"+Inf\"");
  e.sample("dlaunch_store_request_duration_seconds_sum", st.latency_sum_seconds);
  e.sample("dlaunch_store_request_duration_seconds_count", static_cast<double>(st.requests));
}

}  // namespace

std::string to_prometheus(const NodeStatus& s) {
  Exposition e(fmt::format("run_id=\"{}\",node=\"{}\",node_rank=\"{}\"", label_value(s.run_id),
                           label_value(s.host), s.node_rank));
  add_agent_metrics(e, s);
  add_worker_metrics(e, s);
  if (s.store) add_store_metrics(e, *s.store);
  return e.take();
}

std::string host_and_address(const std::string& host, const std::string& local_addr) {
  if (local_addr.empty() || local_addr == host) return host;
  return fmt::format("{} ({})", host, local_addr);
}

}  // namespace dlaunch
