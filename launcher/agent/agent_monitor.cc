#include "launcher/agent/agent_monitor.h"

#include <fmt/format.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <list>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "launcher/agent/agent.h"
#include "launcher/status/control_auth.h"
#include "launcher/config/launch_config.h"
#include "launcher/config/python_hooks.h"
#include "launcher/hang/stack_capture.h"
#include "launcher/hang/stack_capture_run.h"
#include "launcher/status/status_server.h"
#include "rendezvous/store/store.h"
#include "rendezvous/tcp/tcp_store_server.h"

namespace dlaunch {

namespace fs = std::filesystem;

const char* control_action_name(ControlAction a) {
  switch (a) {
    case ControlAction::kStop:
      return "stop";
    case ControlAction::kRestart:
      return "restart";
    case ControlAction::kDump:
      return "dump";
  }
  return "?";
}

MonitorOptions monitor_options(const LaunchConfig& cfg, const AgentOptions& opts) {
  MonitorOptions m;
  m.run_id = cfg.run_id;
  m.host = opts.host;
  m.token = opts.job_token;
  m.status_port = opts.status_endpoint ? cfg.status_port : -1;
  m.status_addr = !cfg.status_addr.empty()  ? cfg.status_addr
                  : !cfg.local_addr.empty() ? cfg.local_addr
                  : opts.rendezvous         ? opts.host
                                            : "127.0.0.1";
  for (const auto& [k, v] : opts.base_env) {
    if (k == "PATH") m.path_env = v;
  }
  if (m.path_env.empty()) m.path_env = "/usr/local/bin:/usr/bin:/bin";
  m.stack_capture_timeout = opts.stack_capture_timeout;
  // Where `dlaunch status` finds the job's store: etcd or c10d's endpoint, else the master
  // address and port (a single node's store may sit on a port picked at start: opts.master_port).
  std::string where;
  if (cfg.rdzv_backend == "etcd") {
    where = "--rdzv_backend etcd --rdzv_endpoint " + cfg.rdzv_endpoint;
  } else if (!cfg.rdzv_endpoint.empty() && (cfg.rdzv_backend == "c10d" || cfg.max_nodes > 1)) {
    // c10d's endpoint, or a static job's given as --rdzv_endpoint instead of the master's.
    where = "--rdzv_endpoint " + cfg.rdzv_endpoint;
  } else {
    std::string addr = opts.master_addr.empty() ? cfg.master_addr : opts.master_addr;
    int64_t port = opts.master_port.value_or(cfg.master_port);
    where = fmt::format("{}--master_port {}",
                        addr == "127.0.0.1" ? "" : "--master_addr " + addr + " ", port);
  }
  m.status_command = fmt::format("dlaunch status {} --rdzv_id {}", where, cfg.run_id);
  return m;
}

namespace {

HttpResponse json_response(int status, const nlohmann::json& j) {
  return HttpResponse{status, "application/json", j.dump(2) + "\n"};
}

HttpResponse message(int status, const std::string& text) {
  return json_response(status, {{"message", text}});
}

std::string header(const HttpRequest& r, const std::string& name) {
  auto it = r.headers.find(name);
  return it == r.headers.end() ? "" : it->second;
}

}  // namespace

struct AgentMonitor::Impl {
  Impl(AgentMonitor& m, ProcessContext& p, boost::asio::io_context& i, MonitorOptions o)
      : owner(m), procs(p), io(i), opts(std::move(o)) {}

  AgentMonitor& owner;
  ProcessContext& procs;
  boost::asio::io_context& io;
  MonitorOptions opts;
  MonitorHooks hooks;
  std::unique_ptr<StatusServer> server;
  std::string address;
  ControlNonces nonces;
  std::thread publisher;
  bool published_locally = false;  // publish() then has nothing to add
  std::list<StackCaptureRun> captures;  // kept until the agent ends: their callbacks hold them
  int64_t dumps = 0;

  void handle(const HttpRequest& r, HttpRespond respond) {
    const std::string path = r.path();
    if (r.method == "GET" && path == "/status") {
      return respond(json_response(200, node_status_json(hooks.snapshot())));
    }
    if (r.method == "GET" && path == "/metrics") {
      return respond(HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8",
                                  to_prometheus(hooks.snapshot())});
    }
    if (r.method == "GET" && path == "/events") {
      std::ifstream in(owner.events_.path());
      std::stringstream text;
      text << in.rdbuf();
      return respond(HttpResponse{200, "application/x-ndjson", text.str()});
    }
    if (r.method == "GET" && path == "/control/nonce") {
      std::string action = r.query("action");
      if (action != "stop" && action != "restart" && action != "dump") {
        return respond(message(400, "action must be stop, restart or dump"));
      }
      return respond(
          json_response(200, {{"nonce", nonces.issue(action, std::chrono::steady_clock::now())},
                              {"token_required", opts.token.has_value()}}));
    }
    if (path.rfind("/control/", 0) == 0) {
      if (r.method != "POST") return respond(message(405, "control endpoints take POST"));
      std::string name = path.substr(9);
      std::optional<ControlAction> action;
      for (auto a : {ControlAction::kStop, ControlAction::kRestart, ControlAction::kDump}) {
        if (name == control_action_name(a)) action = a;
      }
      if (!action) return respond(message(404, "no such control endpoint: " + path));
      std::string who = header(r, "x-dlaunch-client");
      who = fmt::format("{}{}", who.empty() ? "" : who + " from ", r.peer);
      if (opts.token) {
        std::string why = nonces.check(
            *opts.token, name, header(r, "x-dlaunch-nonce"), header(r, "x-dlaunch-client-nonce"),
            header(r, "x-dlaunch-proof"), std::chrono::steady_clock::now());
        if (!why.empty()) {
          log_warning("refused a control request ({}) from {}: {}", name, r.peer, why);
          owner.events_.emit("control_refused", {{"action", name}, {"peer", r.peer}, {"why", why}});
          return respond(message(403, "refused: " + why +
                                          "; give the job's token (DLAUNCH_JOB_TOKEN or "
                                          "--rdzv_conf token_file=PATH)"));
        }
      }
      owner.events_.emit("control_request", {{"action", name}, {"by", who}});
      if (*action == ControlAction::kDump) return dump(who, std::move(respond));
      ControlAnswer a = hooks.control(*action, who);
      if (a.http_status >= 400) {
        owner.events_.emit("control_refused",
                           {{"action", name}, {"peer", r.peer}, {"why", a.message}});
      }
      return respond(message(a.http_status, a.message));
    }
    if (path == "/status" || path == "/metrics" || path == "/events" || path == "/control/nonce") {
      return respond(message(405, r.method + " is not allowed on " + path + "; use GET"));
    }
    respond(
        message(404, "not found: " + path +
                         " (try /status, /metrics, /events or POST /control/stop|restart|dump)"));
  }

  // Every running worker's stacks, now, into <run dir>/dumps/<n>_<time>/rank_<rank>.txt.
  void dump(const std::string& who, HttpRespond respond) {
    NodeStatus s = hooks.snapshot();
    std::vector<const WorkerStatus*> running;
    for (const auto& w : s.workers) {
      if (w.state == "running" && w.pid > 0) running.push_back(&w);
    }
    if (running.empty()) return respond(message(409, "no worker is running on " + opts.host));
    if (stack_capture_command(running.front()->pid, opts.path_env).empty()) {
      return respond(message(501, "neither eu-stack (elfutils) nor gdb is installed on " +
                                      opts.host + "; install one of them to capture stacks"));
    }
    auto stamp = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
    std::string dir = fmt::format("{}/dumps/{}_{}", owner.run_dir_, dumps++, stamp);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return respond(message(500, "cannot create " + dir + ": " + ec.message()));
    log_info("dumping the stacks of {} worker(s) into {} (asked by {})", running.size(), dir, who);
    struct Pending {
      size_t left = 0;
      nlohmann::json files = nlohmann::json::array();
      HttpRespond respond;
    };
    auto pending = std::make_shared<Pending>();
    pending->left = running.size();
    pending->respond = std::move(respond);
    std::string host = opts.host;
    auto done_one = [this, pending, dir, host](nlohmann::json entry) {
      pending->files.push_back(std::move(entry));
      if (--pending->left > 0) return;
      owner.events_.emit("stacks_dumped", {{"dir", dir}, {"workers", pending->files.size()}});
      pending->respond(
          json_response(200, {{"host", host}, {"dir", dir}, {"files", pending->files}}));
    };
    for (const WorkerStatus* w : running) {
      std::string file = fmt::format("{}/rank_{}.txt", dir, w->global_rank);
      SpawnRequest req;
      req.argv = stack_capture_command(w->pid, opts.path_env);
      req.env = {{"PATH", opts.path_env}};
      StackCaptureRun::Callbacks cb;
      int64_t rank = w->global_rank;
      int pid = w->pid;
      // Python workers with dlaunch's hooks dump their own stacks on a signal, at once; they are
      // appended after the native ones once the tool is done (python_hooks.h).
      std::string py_file = w->log_dir + "/py_stack.txt";
      std::optional<uint64_t> py_offset;
      if (!w->log_dir.empty()) py_offset = request_python_stacks(py_file, pid);
      cb.on_done = [done_one, file, rank, pid, py_file, py_offset](const ExitStatus& st,
                                                                   const std::string&) {
        if (py_offset) {
          std::ofstream out(file, std::ios::app);
          out << "\n--- Python stacks (faulthandler) ---\n" << read_python_stacks(py_file, *py_offset);
        }
        done_one({{"rank", rank},
                  {"pid", pid},
                  {"file", file},
                  {"tool", st.describe()},
                  {"python_stacks", py_offset.has_value()}});
      };
      cb.on_failed = [done_one, file, rank, pid](const std::string& why) {
        done_one({{"rank", rank}, {"pid", pid}, {"file", nullptr}, {"error", why}});
      };
      captures.emplace_back(procs, io);
      try {
        captures.back().start(std::move(req), file, opts.stack_capture_timeout, std::move(cb));
      } catch (const Error& e) {
        done_one({{"rank", rank}, {"pid", pid}, {"file", nullptr}, {"error", e.what()}});
      }
    }
  }
};

AgentMonitor::AgentMonitor(ProcessContext& procs, boost::asio::io_context& io,
                           MonitorOptions options)
    : impl_(std::make_unique<Impl>(*this, procs, io, std::move(options))) {}

AgentMonitor::~AgentMonitor() {
  stop();
}

void AgentMonitor::open_timeline(const std::string& run_dir) {
  run_dir_ = run_dir;
  events_.open(run_dir + "/events.jsonl", impl_->opts.host, static_cast<int>(::getpid()));
  events_.emit("agent_started", {{"run_id", impl_->opts.run_id}});
}

std::string AgentMonitor::start_endpoint(MonitorHooks hooks) {
  if (impl_->opts.status_port < 0) return "";
  impl_->hooks = std::move(hooks);
  impl_->server = std::make_unique<StatusServer>(
      impl_->io, [impl = impl_.get()](const HttpRequest& r, HttpRespond respond) {
        impl->handle(r, std::move(respond));
      });
  try {
    impl_->server->start(impl_->opts.status_addr, static_cast<uint16_t>(impl_->opts.status_port));
  } catch (const Error& e) {
    impl_->server.reset();
    if (impl_->opts.status_port != 0) throw;
    log_warning("{}; running without a status endpoint", e.what());
    return "";
  }
  impl_->address = impl_->server->address();
  log_info(
      "status endpoint: http://{}/status (also /metrics; --status_port -1 turns it off){}",
      impl_->address,
      impl_->opts.status_command.empty() ? "" : "; every node's: " + impl_->opts.status_command);
  events_.emit("status_endpoint", {{"address", impl_->address}});
  return impl_->address;
}

void AgentMonitor::publish(std::function<std::shared_ptr<Store>()> open_store) {
  if (impl_->address.empty() || impl_->publisher.joinable() || impl_->published_locally) return;
  nlohmann::json entry = {{"address", impl_->address},
                          {"host", impl_->opts.host},
                          {"pid", static_cast<int>(::getpid())}};
  impl_->publisher = std::thread([open_store = std::move(open_store), entry]() {
    try {
      std::shared_ptr<Store> store = open_store();
      if (!store) return;
      int64_t index = store->add(kStatusAgentsKey, 1) - 1;
      store->set(status_agent_key(index), to_bytes(entry.dump()));
      log_debug("status endpoint published in the job's store as {}", status_agent_key(index));
    } catch (const std::exception& e) {
      log_warning(
          "could not publish the status endpoint in the job's store ({}); `dlaunch "
          "status` will not list this node",
          e.what());
    }
  });
}

void AgentMonitor::publish_local(TcpStoreServer& server) {
  if (impl_->address.empty()) return;
  nlohmann::json entry = {{"address", impl_->address},
                          {"host", impl_->opts.host},
                          {"pid", static_cast<int>(::getpid())}};
  const std::string prefix = job_store_prefix(impl_->opts.run_id) + "/";
  try {
    int64_t index = server.add_local(prefix + kStatusAgentsKey, 1) - 1;
    server.set_local(prefix + status_agent_key(index), to_bytes(entry.dump()));
    impl_->published_locally = true;
  } catch (const std::exception& e) {
    log_warning("could not publish the status endpoint in the job's store ({}); `dlaunch "
                "status` will not list this node",
                e.what());
  }
}

void AgentMonitor::stop() {
  if (impl_->server) impl_->server->stop();
  if (impl_->publisher.joinable()) impl_->publisher.join();
}

}  // namespace dlaunch
