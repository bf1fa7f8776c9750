#include "launcher/status/job_control.h"

#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "common/env.h"
#include "common/error.h"
#include "launcher/status/control_auth.h"
#include "launcher/status/http_client.h"
#include "launcher/status/job_events.h"
#include "launcher/status/node_status.h"
#include "launcher/status/status_keys.h"
#include "rendezvous/etcd/etcd_endpoints.h"
#include "rendezvous/etcd/etcd_rendezvous.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/tcp/host_port.h"
#include "rendezvous/tcp/job_token.h"
#include "rendezvous/store/prefix_store.h"
#include "rendezvous/tcp/tcp_store_client.h"

namespace dlaunch {

namespace {

struct Options {
  std::string command;
  std::string rdzv_backend;  // "etcd": the agents published in etcd; else in a TCP store
  std::string rdzv_endpoint;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
  std::string run_id = "none";
  std::string token_file;
  bool json = false;
  bool events = false;
  double timeout = 5;
  bool help = false;
};

const char* const kUsage =
    "usage: dlaunch status|stop|restart|dump [[--rdzv_backend etcd] --rdzv_endpoint HOST[:PORT] "
    "| --master_addr HOST --master_port PORT] --rdzv_id ID [--token_file PATH] [--json] "
    "[--events] [--timeout S]";

// The combinations parse() cannot refuse flag by flag.
void check_options(const Options& o) {
  if (!o.rdzv_backend.empty() && o.rdzv_backend != "static" && o.rdzv_backend != "c10d" &&
      o.rdzv_backend != "etcd") {
    throw UsageError(fmt::format("--rdzv_backend '{}' is not one of static, c10d, etcd (the "
                                 "job's own --rdzv_backend)",
                                 o.rdzv_backend));
  }
  if (o.rdzv_backend == "etcd" && o.rdzv_endpoint.empty()) {
    throw UsageError(
        "--rdzv_backend etcd needs --rdzv_endpoint HOST:PORT, etcd's client URL (or its "
        "members' list) as the job was given it (e.g. 10.0.0.5:2379)");
  }
  if ((o.events || o.json) && o.command != "status") {
    throw UsageError(
        fmt::format("--json and --events belong to 'dlaunch status', not '{}'", o.command));
  }
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  o.command = args.at(0);
  auto env_or = [](const char* name, std::string fallback) {
    auto v = get_env(name);
    return v ? *v : fallback;
  };
  o.rdzv_backend = env_or("DLAUNCH_RDZV_BACKEND", env_or("PET_RDZV_BACKEND", ""));
  o.rdzv_endpoint = env_or("DLAUNCH_RDZV_ENDPOINT", env_or("PET_RDZV_ENDPOINT", ""));
  o.master_addr = env_or("DLAUNCH_MASTER_ADDR", env_or("MASTER_ADDR", o.master_addr));
  // In a worker's own environment MASTER_ADDR/MASTER_PORT and TORCHELASTIC_RUN_ID find its job.
  o.run_id =
      env_or("DLAUNCH_RDZV_ID", env_or("PET_RDZV_ID", env_or("TORCHELASTIC_RUN_ID", o.run_id)));
  std::string port_text = env_or("DLAUNCH_MASTER_PORT", env_or("MASTER_PORT", ""));
  for (size_t i = 1; i < args.size(); ++i) {
    std::string a = args[i];
    std::optional<std::string> attached;
    if (size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      attached = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    for (auto& c : a) c = c == '-' ? '_' : c;
    auto value = [&]() -> std::string {
      if (attached) return *attached;
      if (i + 1 >= args.size()) throw UsageError(fmt::format("{} needs a value", args[i]));
      return args[++i];
    };
    if (a == "__rdzv_backend")
      o.rdzv_backend = value();
    else if (a == "__rdzv_endpoint")
      o.rdzv_endpoint = value();
    else if (a == "__master_addr")
      o.master_addr = value();
    else if (a == "__master_port")
      port_text = value();
    else if (a == "__rdzv_id" || a == "__run_id")
      o.run_id = value();
    else if (a == "__token_file")
      o.token_file = value();
    else if (a == "__rdzv_conf") {
      std::string conf = value();
      size_t at = conf.find("token_file=");
      if (at != std::string::npos) {
        o.token_file = conf.substr(at + 11, conf.find(',', at) - at - 11);
      }
    } else if (a == "__json")
      o.json = true;
    else if (a == "__events")
      o.events = true;
    else if (a == "__timeout") {
      std::string text = value();
      o.timeout = parse_double(text, "--timeout");
      if (!(o.timeout > 0 && o.timeout <= 1e7)) {  // also refuses nan
        throw UsageError(fmt::format(
            "--timeout {} is not allowed; expected seconds, more than 0 and at most 1e7", text));
      }
    } else if (a == "__help" || a == "_h")
      o.help = true;
    else {
      throw UsageError(
          fmt::format("'{}' is not an option of 'dlaunch {}'; {}", args[i], o.command, kUsage));
    }
  }
  if (!port_text.empty()) {
    try {
      o.master_port = std::stoll(port_text);
    } catch (const std::exception&) {
      throw UsageError(fmt::format("--master_port '{}' is not a port number", port_text));
    }
  }
  check_options(o);
  return o;
}

struct Agent {
  std::string address;
  std::string host;
  int pid = 0;
};

// Whether `hp` refuses connections (every address it resolves to answers RST): nothing listens
// there, so there is no job to wait for. Anything else (it accepts, it is silent, it does not
// resolve) is left to the store client and its timeout.
bool refuses_connections(const HostPort& hp) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(hp.host.c_str(), std::to_string(hp.port).c_str(), &hints, &res) != 0) {
    return false;
  }
  bool refused = res != nullptr;
  for (addrinfo* ai = res; ai && refused; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      refused = false;
      break;
    }
    int err = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      err = ETIMEDOUT;
      if (::poll(&p, 1, 2000) == 1) {
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    ::close(fd);
    refused = err == ECONNREFUSED;
  }
  ::freeaddrinfo(res);
  return refused;
}

// The job's store (status_keys.h), where the agents published their endpoints: in etcd with
// --rdzv_backend etcd (the rendezvous' result store lives there, etcd_rendezvous.h), else the
// TCP store at the rendezvous endpoint or MASTER_ADDR:MASTER_PORT.
std::unique_ptr<Store> open_job_store(const Options& o, std::string& where) {
  auto limit = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(o.timeout));
  if (o.rdzv_backend == "etcd") {
    const std::string members =
        etcd::format_endpoints(etcd::parse_endpoints(o.rdzv_endpoint, "--rdzv_endpoint"));
    where = "etcd at " + members;
    return std::make_unique<PrefixStore>(job_store_prefix(o.run_id),
                                         open_etcd_run_store(members, o.run_id, limit));
  }
  HostPort hp = o.rdzv_endpoint.empty()
                    ? HostPort{o.master_addr, static_cast<uint16_t>(o.master_port)}
                    : parse_host_port(o.rdzv_endpoint, 29400, "--rdzv_endpoint");
  where = hp.to_string();
  if (refuses_connections(hp)) {
    throw ConnectionError("nothing listens there (connection refused): no job runs with its "
                          "store at that address");
  }
  TcpStoreClientOptions c;
  c.host = hp.host;
  c.port = hp.port;
  c.agent = true;
  c.token = load_job_token(o.token_file);
  c.connect_timeout = limit;
  c.timeout = limit;
  c.first_waiting_note = limit * 2;
  return std::make_unique<PrefixStore>(job_store_prefix(o.run_id),
                                       std::make_shared<TcpStoreClient>(c));
}

// Every agent that published its endpoint, read from the job's store.
std::vector<Agent> find_agents(const Options& o, std::string& where) {
  std::unique_ptr<Store> job_store = open_job_store(o, where);
  Store& store = *job_store;
  // check() first: reading must not create the counter (in a shared etcd, for a mistyped id).
  int64_t n = store.check({kStatusAgentsKey}) ? store.add(kStatusAgentsKey, 0) : 0;
  std::vector<std::string> keys;
  for (int64_t i = 0; i < n; ++i) keys.push_back(status_agent_key(i));
  std::vector<Agent> agents;
  for (const auto& key : keys) {
    if (!store.check({key})) continue;  // added its index, not yet its address
    auto j = nlohmann::json::parse(to_string(store.get(key)));
    agents.push_back(Agent{j.value("address", ""), j.value("host", ""), j.value("pid", 0)});
  }
  return agents;
}

struct Answer {
  bool ok = false;
  int status = 0;
  std::string body;
  std::string error;  // transport failure
};

// Runs `f` for every agent at once; answers in the agents' order.
template <typename F>
std::vector<Answer> for_each_agent(const std::vector<Agent>& agents, F f) {
  std::vector<Answer> out(agents.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < agents.size(); ++i) {
    threads.emplace_back([&, i]() {
      try {
        out[i] = f(agents[i]);
      } catch (const std::exception& e) {
        out[i].error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

Answer ask(const std::string& address, const std::string& method, const std::string& target,
           const std::map<std::string, std::string>& headers, double timeout) {
  Answer a;
  try {
    auto d = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(timeout));
    HttpReply r = http_request(address, method, target, headers, "", d);
    a.status = r.status;
    a.body = r.body;
    a.ok = r.status == 200;
  } catch (const std::exception& e) {
    a.error = e.what();
  }
  return a;
}

std::string age(double seconds) {
  if (seconds < 0) return "-";
  if (seconds < 120) return fmt::format("{:.1f}s", seconds);
  if (seconds < 7200) return fmt::format("{:.0f}m", seconds / 60);
  return fmt::format("{:.1f}h", seconds / 3600);
}

std::string bytes(int64_t b) {
  if (b < (1 << 20)) return fmt::format("{}K", b >> 10);
  if (b < (int64_t{1} << 30)) return fmt::format("{:.1f}M", static_cast<double>(b) / (1 << 20));
  return fmt::format("{:.2f}G", static_cast<double>(b) / (1 << 30));
}

// `dlaunch status --events`: every agent's timeline, merged in time order.
int events_command(const Options& o, const std::vector<Agent>& agents) {
  auto answers = for_each_agent(
      agents, [&](const Agent& a) { return ask(a.address, "GET", "/events", {}, o.timeout); });
  std::vector<nlohmann::json> timelines;
  int code = 0;
  for (size_t i = 0; i < agents.size(); ++i) {
    if (!answers[i].ok) {
      std::fprintf(stderr, "dlaunch: %s (%s): no timeline: %s\n", agents[i].host.c_str(),
                   agents[i].address.c_str(),
                   answers[i].error.empty() ? answers[i].body.c_str() : answers[i].error.c_str());
      code = 1;
      continue;
    }
    timelines.push_back(parse_timeline(answers[i].body));
  }
  nlohmann::json merged = merge_timelines(timelines);
  if (o.json) {
    std::cout << merged.dump(2) << "\n";
  } else {
    for (const auto& e : merged) std::cout << format_event_line(e) << "\n";
  }
  return code;
}

// One agent's answer to GET /status: its status, or why it has none.
// An agent whose status port refuses connections has ended (its host answers, nothing listens
// any more): it left the job, which is no error of the job's.
bool left(const Answer& a) {
  return a.error.find(std::string("cannot connect: ") + std::strerror(ECONNREFUSED)) !=
         std::string::npos;
}

struct AgentStatus {
  Agent agent;
  std::optional<NodeStatus> status;
  std::string unreachable;
  bool left = false;  // it ended (its port refuses)
};

// Asks every agent for its status; `all` gets each answer as JSON with the agent's address, or
// the agent with the reason it did not answer.
std::vector<AgentStatus> ask_statuses(const Options& o, const std::vector<Agent>& agents,
                                      nlohmann::json& all) {
  auto answers = for_each_agent(
      agents, [&](const Agent& a) { return ask(a.address, "GET", "/status", {}, o.timeout); });
  std::vector<AgentStatus> nodes;
  for (size_t i = 0; i < agents.size(); ++i) {
    AgentStatus node{agents[i], std::nullopt, "", left(answers[i])};
    if (answers[i].ok) {
      try {
        auto j = nlohmann::json::parse(answers[i].body);
        node.status = node_status_from_json(j);
        j["address"] = agents[i].address;
        all.push_back(j);
      } catch (const std::exception& e) {
        answers[i].error = std::string("unreadable answer: ") + e.what();
      }
    }
    if (!node.status) {
      node.unreachable =
          answers[i].error.empty() ? fmt::format("HTTP {}", answers[i].status) : answers[i].error;
      nlohmann::json gone = {{"address", agents[i].address},
                             {"host", agents[i].host},
                             {"agent_pid", agents[i].pid}};
      if (node.left) {
        gone["left"] = true;
      } else {
        gone["unreachable"] = answers[i].error.empty() ? answers[i].body : answers[i].error;
      }
      all.push_back(gone);
    }
    nodes.push_back(std::move(node));
  }
  return nodes;
}

// The agents' table: one line per node, in node-rank order.
std::string format_agent_table(const std::vector<AgentStatus>& nodes) {
  std::string out =
      fmt::format("{:<5} {:<22} {:<8} {:<16} {:>7} {:>5} {:>9} {:>8} {}\n", "NODE", "ENDPOINT",
                  "AGENT", "PHASE", "ATTEMPT", "ROUND", "RESTARTS", "RSS", "STORE");
  for (const auto& [a, s, unreachable, gone] : nodes) {
    if (!s) {
      out += gone ? fmt::format("{:<5} {:<22} {:<8} left (its agent ended)\n", "-", a.address,
                                a.pid)
                  : fmt::format("{:<5} {:<22} {:<8} unreachable: {}\n", "?", a.address, a.pid,
                                unreachable);
      continue;
    }
    std::string store = "-";
    if (s->store) {
      store = fmt::format("{} keys, {} conns, {:.0f} req/s, p50 {:.0f}us p99 {:.0f}us",
                          s->store->keys, s->store->connections, s->store->requests_per_s,
                          s->store->p50_seconds * 1e6, s->store->p99_seconds * 1e6);
    }
    out += fmt::format("{:<5} {:<22} {:<8} {:<16} {:>7} {:>5} {:>9} {:>8} {}\n", s->node_rank,
                       a.address, s->agent_pid, s->phase, s->attempt, s->round,
                       fmt::format("{}/{}", s->restarts, s->max_restarts),
                       s->agent_usage ? bytes(s->agent_usage->rss_bytes) : "-", store);
  }
  // A job that waits at the rendezvous: how far its round got, as each waiting agent saw it.
  for (const auto& node : nodes) {
    const auto& s = node.status;
    if (!s || s->phase != "rendezvous" || s->rendezvous_joined.empty()) continue;
    out += fmt::format("{} ({}) waits at the rendezvous: {}\n",
                       host_and_address(s->host, s->local_addr), node.agent.address,
                       s->rendezvous_joined);
  }
  return out;
}

// The workers' table: one line per worker of every node that answered.
std::string format_worker_table(const std::vector<AgentStatus>& nodes, double now) {
  std::string out =
      fmt::format("{:<5} {:<16} {:>5} {:>5} {:>8} {:<10} {:>8} {:>9} {:>8} {:>8} {}\n", "NODE",
                  "HOST", "RANK", "LOCAL", "PID", "STATE", "UP", "HEARTBEAT", "RSS", "CPU", "EXIT");
  for (const auto& node : nodes) {
    const auto& s = node.status;
    if (!s) continue;
    for (const auto& w : s->workers) {
      std::string exit = w.exit_code     ? fmt::format("code {}", *w.exit_code)
                         : w.exit_signal ? fmt::format("signal {}", *w.exit_signal)
                                         : "-";
      out += fmt::format("{:<5} {:<16} {:>5} {:>5} {:>8} {:<10} {:>8} {:>9} {:>8} {:>8} {}\n",
                         s->node_rank, host_and_address(s->host, s->local_addr), w.global_rank,
                         w.local_rank, w.pid, w.state,
                         w.start_time > 0 && w.state == "running" ? age(now - w.start_time) : "-",
                         w.heartbeat_age_seconds ? age(*w.heartbeat_age_seconds) : "-",
                         w.usage ? bytes(w.usage->rss_bytes) : "-",
                         w.usage ? fmt::format("{:.1f}s", w.usage->cpu_seconds) : "-", exit);
    }
  }
  return out;
}

int status_command(const Options& o, const std::vector<Agent>& agents) {
  if (o.events) return events_command(o, agents);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  nlohmann::json all = nlohmann::json::array();
  std::vector<AgentStatus> nodes = ask_statuses(o, agents, all);
  // Agents that left are listed as such, not as errors; only an agent that should answer and
  // does not makes the exit 1.
  const bool any_unreachable = std::any_of(
      nodes.begin(), nodes.end(), [](const AgentStatus& n) { return !n.status && !n.left; });
  const int code = any_unreachable ? 1 : 0;
  if (o.json) {
    std::cout << nlohmann::json({{"run_id", o.run_id}, {"agents", all}}).dump(2) << "\n";
    return code;
  }
  std::sort(nodes.begin(), nodes.end(), [](const AgentStatus& a, const AgentStatus& b) {
    int64_t ra = a.status ? a.status->node_rank : INT64_MAX;
    int64_t rb = b.status ? b.status->node_rank : INT64_MAX;
    return ra != rb ? ra < rb : a.agent.address < b.agent.address;
  });
  std::cout << fmt::format("job {}: {} agent(s)\n", o.run_id, agents.size())
            << format_agent_table(nodes) << "\n"
            << format_worker_table(nodes, now);
  return code;
}

// POST /control/<action> with the proof of the token when we have one.
Answer control(const Agent& a, const std::string& action, const std::optional<std::string>& token,
               double timeout) {
  std::map<std::string, std::string> headers{{"X-Dlaunch-Client", "dlaunch " + action}};
  if (token) {
    Answer n = ask(a.address, "GET", "/control/nonce?action=" + action, {}, timeout);
    if (!n.ok) return n;
    std::string nonce;
    try {
      nonce = nlohmann::json::parse(n.body).value("nonce", "");
    } catch (const std::exception& e) {
      n.ok = false;
      n.error = std::string("unreadable nonce: ") + e.what();
      return n;
    }
    ControlProof p = prove_control(*token, nonce);
    headers["X-Dlaunch-Nonce"] = nonce;
    headers["X-Dlaunch-Client-Nonce"] = p.client_nonce_hex;
    headers["X-Dlaunch-Proof"] = p.proof_hex;
  }
  return ask(a.address, "POST", "/control/" + action, headers, timeout);
}

std::string answer_text(const Answer& a) {
  if (!a.error.empty()) return a.error;
  try {
    auto j = nlohmann::json::parse(a.body);
    if (j.contains("message")) return j["message"].get<std::string>();
    return j.dump();
  } catch (const std::exception&) {
    return a.body;
  }
}

int control_command(const Options& o, const std::vector<Agent>& agents) {
  auto token = load_job_token(o.token_file);
  if (o.command == "restart") {
    // One agent is enough: it restarts the job-wide group through the rendezvous, as a failure
    // does. The first that accepts wins; the others are not asked.
    for (const auto& a : agents) {
      Answer r = control(a, "restart", token, o.timeout);
      if (r.ok) {
        std::cout << answer_text(r) << "\n";
        return 0;
      }
      std::fprintf(stderr, "dlaunch: %s (%s): %s\n", a.host.c_str(), a.address.c_str(),
                   answer_text(r).c_str());
      if (r.status == 403 || r.status == 409) return 1;
    }
    return 1;
  }
  // A dump waits for the stack tools (up to their 15 s timeout).
  double timeout = o.command == "dump" ? std::max(o.timeout, 30.0) : o.timeout;
  auto answers =
      for_each_agent(agents, [&](const Agent& a) { return control(a, o.command, token, timeout); });
  int code = 0;
  for (size_t i = 0; i < agents.size(); ++i) {
    const Answer& r = answers[i];
    if (!r.ok && left(r)) {
      std::cout << fmt::format("{} ({}): left the job already\n", agents[i].host,
                               agents[i].address);
      continue;
    }
    if (!r.ok) {
      code = 1;
      std::fprintf(stderr, "dlaunch: %s (%s): %s\n", agents[i].host.c_str(),
                   agents[i].address.c_str(), answer_text(r).c_str());
      continue;
    }
    if (o.command == "dump") {
      auto j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j["files"].is_array()) {
        code = 1;
        std::fprintf(stderr, "dlaunch: %s (%s): unreadable answer: %s\n", agents[i].host.c_str(),
                     agents[i].address.c_str(), r.body.c_str());
        continue;
      }
      std::cout << fmt::format("{}: stacks of {} worker(s) in {}\n", j.value("host", "?"),
                               j["files"].size(), j.value("dir", "?"));
      for (const auto& f : j["files"]) {
        if (f["file"].is_null()) {
          std::cout << fmt::format("  rank {}: {}\n", f.value("rank", -1), f.value("error", ""));
        }
      }
    } else {
      std::cout << answer_text(r) << "\n";
    }
  }
  return code;
}

}  // namespace

int run_job_control(const std::vector<std::string>& args) {
  Options o;
  try {
    o = parse(args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "dlaunch: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dlaunch: error: %s; %s\n", e.what(), kUsage);
    return 2;
  }
  if (o.help) {
    std::printf("%s\n(see docs/monitoring.md)\n", kUsage);
    return 0;
  }
  std::vector<Agent> agents;
  std::string where;
  try {
    agents = find_agents(o, where);
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "dlaunch: error: cannot read the job's agents from its store at %s: %s; give "
                 "the job's --rdzv_endpoint (or --master_addr/--master_port; with an etcd "
                 "rendezvous also --rdzv_backend etcd) and, with a job token, DLAUNCH_JOB_TOKEN "
                 "or --token_file\n",
                 where.empty() ? "?" : where.c_str(), e.what());
    return 2;
  }
  if (agents.empty()) {
    std::fprintf(stderr,
                 "dlaunch: error: no agent of job '%s' published a status endpoint in the store "
                 "at %s; check --rdzv_id (the job's run id), and that the agents run without "
                 "--status_port -1\n",
                 o.run_id.c_str(), where.c_str());
    return 2;
  }
  try {
    if (o.command == "status") return status_command(o, agents);
    return control_command(o, agents);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dlaunch: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace dlaunch
