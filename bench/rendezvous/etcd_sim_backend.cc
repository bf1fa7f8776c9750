#include "bench/rendezvous/etcd_sim_backend.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_rendezvous.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/handlers/dynamic_rendezvous.h"
#include "rendezvous/handlers/rendezvous_events.h"
#include "tests/support/free_port.h"

namespace dlaunch::sim {
namespace {

bool etcd_installed() {
  const char* path = getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    if (access((dirs.substr(start, end - start) + "/etcd").c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

EtcdServer start_etcd_server() {
  if (!etcd_installed()) {
    throw UsageError(
        "rdzv_sim --backend etcd: no 'etcd' on PATH; install it with scripts/setup.sh --test "
        "(Debian's etcd-server), or name a running one with --etcd_endpoint HOST:PORT");
  }
  char tmpl[] = "/tmp/rdzv_sim_etcd.XXXXXX";
  if (!mkdtemp(tmpl)) throw SystemError("rdzv_sim: mkdtemp for etcd's data failed");
  EtcdServer s;
  s.dir = tmpl;
  s.owned = true;
  const int client = testing::free_port();
  int peer = testing::free_port();
  while (peer == client) peer = testing::free_port();
  s.endpoint = fmt::format("127.0.0.1:{}", client);
  const std::string client_url = "http://" + s.endpoint;
  const std::string peer_url = fmt::format("http://127.0.0.1:{}", peer);
  std::vector<std::string> args = {"etcd",
                                   "--name", "sim",
                                   "--data-dir", s.dir + "/data",
                                   "--listen-client-urls", client_url,
                                   "--advertise-client-urls", client_url,
                                   "--listen-peer-urls", peer_url,
                                   "--initial-advertise-peer-urls", peer_url,
                                   "--initial-cluster", "sim=" + peer_url,
                                   "--initial-cluster-state", "new",
                                   "--logger", "zap",
                                   "--log-outputs", s.dir + "/etcd.log"};
  pid_t pid = fork();
  if (pid < 0) throw SystemError("rdzv_sim: fork for etcd failed");
  if (pid == 0) {
    setsid();  // not in the simulator's process group: a ^C reaches the simulator only
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp("etcd", argv.data());
    _exit(127);
  }
  s.pid = pid;
  etcd::ClientOptions o;
  o.endpoint = s.endpoint;
  o.connect_timeout = std::chrono::milliseconds(500);
  o.request_timeout = std::chrono::seconds(2);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      s.pid = 0;
      throw SystemError(fmt::format("rdzv_sim: etcd exited while starting (status {}); its log: "
                                    "{}/etcd.log",
                                    status, s.dir));
    }
    try {
      etcd::Client(o).range("/health-check");
      return s;
    } catch (const Error&) {
    }
    if (std::chrono::steady_clock::now() > give_up) {
      stop_etcd_server(s);
      throw SystemError(fmt::format(
          "rdzv_sim: etcd on {} did not answer within 30 s of its start", s.endpoint));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void stop_etcd_server(EtcdServer& s) {
  if (!s.owned) return;
  if (s.pid > 0) {
    kill(s.pid, SIGTERM);
    for (int i = 0; i < 100 && waitpid(s.pid, nullptr, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (kill(s.pid, 0) == 0) {
      kill(s.pid, SIGKILL);
      waitpid(s.pid, nullptr, 0);
    }
    s.pid = 0;
  }
  std::error_code ignored;
  std::filesystem::remove_all(s.dir, ignored);
}

EtcdSimAgent make_etcd_sim_agent(const RendezvousParams& params) {
  auto handler = std::make_unique<EtcdRendezvous>(params);
  handler->drive_keep_alive_externally();
  EtcdSimAgent a;
  a.keep_alive_step = [h = handler.get()] { h->keep_alive_step(); };
  auto events = open_etcd_run_store(params.endpoint, params.run_id, std::chrono::seconds(30));
  // The call a real agent's EventWatcher makes once a second, less its wait: through the
  // store's watch of the key, which reads the missing key once and then nothing.
  a.event_set = [events, prefix = DynamicRendezvous::key_prefix(params.run_id)](int64_t round) {
    try {
      events->wait({event_key(prefix, round)}, std::chrono::milliseconds(1));
      return true;
    } catch (const TimeoutError&) {
      return false;
    }
  };
  a.handler = std::move(handler);
  return a;
}

EtcdTraffic etcd_traffic() {
  EtcdTraffic t;
  for (const auto& [what, count] : etcd::call_counts()) {
    if (what.rfind("/v3/", 0) == 0 || what == "watches opened") t.calls += count;
    if (what == "watch events") t.watch_events += count;
  }
  return t;
}

std::map<std::string, int64_t> etcd_calls_by_path() { return etcd::call_counts(); }

}  // namespace dlaunch::sim
