// An etcd of a test's own (tests/cluster/start_etcd.sh in a temporary directory): one member or
// a cluster of several on loopback, for tests that kill and restart members, which the shared
// fixture's etcd must survive. Header-only: the store tests link no test support library.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "rendezvous/etcd/etcd_client.h"

namespace dlaunch::test {

class PrivateEtcd {
 public:
  // Starts `members` members; check ok() (a test asserts it: etcd is installed where these
  // tests run, the fixture's start says so otherwise).
  explicit PrivateEtcd(int members) : members_(members) {
    char dir_template[] = "/tmp/dlaunch-private-etcd-XXXXXX";
    if (mkdtemp(dir_template) == nullptr) return;
    dir_ = dir_template;
    ok_ = std::system((scripts() + "/start_etcd.sh " + dir_ + " --members " +
                       std::to_string(members) + " >" + dir_ + "/start.log 2>&1")
                          .c_str()) == 0;
    if (ok_) std::ifstream(dir_ + "/endpoint") >> endpoints_;
  }
  ~PrivateEtcd() {
    if (dir_.empty()) return;
    // SIGKILL, not stop_etcd.sh's SIGTERM: a leader told to stop first tries to hand over its
    // leadership, for seconds when a peer is dead. Nothing of this etcd is kept.
    for (int i = 1; i <= members_; ++i) kill_member(i);
    std::system((scripts() + "/stop_etcd.sh " + dir_ + " >/dev/null 2>&1").c_str());
    std::system(("rm -rf " + dir_).c_str());
  }
  PrivateEtcd(const PrivateEtcd&) = delete;
  PrivateEtcd& operator=(const PrivateEtcd&) = delete;

  bool ok() const { return ok_; }
  // The client endpoint, or the comma-separated list of every member's.
  const std::string& endpoints() const { return endpoints_; }
  std::string start_log() const { return read(dir_ + "/start.log"); }

  // Member i (1-based) of a cluster; the only member is 1.
  std::string member_endpoint(int i) const { return first_line(member_dir(i) + "/endpoint"); }

  // SIGKILLs member i and waits until its client port refuses connections (a killed etcd's
  // main thread turns zombie before its other threads are gone and its sockets closed).
  void kill_member(int i) {
    const std::string pid_text = first_line(member_dir(i) + "/etcd.pid");
    if (pid_text.empty()) return;
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    if (pid <= 1) return;
    ::kill(pid, SIGKILL);
    etcd::ClientOptions o;
    o.endpoint = member_endpoint(i);
    o.connect_timeout = std::chrono::seconds(1);
    o.request_timeout = std::chrono::seconds(1);
    for (int n = 0; n < 100; ++n) {
      try {
        etcd::Client(o).call("/v3/maintenance/status", "{}");
      } catch (const ConnectionError&) {
        return;  // refused: gone
      } catch (const Error&) {
        // still there, but dying
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // Starts member i again on its data; true once it answers (up to 30 s).
  bool restart_member(int i) {
    if (std::system((member_dir(i) + "/start.sh").c_str()) != 0) return false;
    etcd::ClientOptions o;
    o.endpoint = member_endpoint(i);
    o.connect_timeout = std::chrono::seconds(1);
    o.request_timeout = std::chrono::seconds(2);
    etcd::Client client(o);
    for (int n = 0; n < 150; ++n) {
      try {
        client.call("/v3/maintenance/status", "{}");
        return true;
      } catch (const Error&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
    return false;
  }

  // The member (1-based) the live members name as their leader; nullopt while they have none.
  std::optional<int> leader() const {
    for (int i = 1; i <= members_; ++i) {
      etcd::ClientOptions o;
      o.endpoint = member_endpoint(i);
      o.connect_timeout = std::chrono::seconds(1);
      o.request_timeout = std::chrono::seconds(2);
      try {
        auto j = nlohmann::json::parse(etcd::Client(o).call("/v3/maintenance/status", "{}"));
        const std::string leader = j.value("leader", "");
        if (leader.empty() || leader == "0") continue;
        for (int k = 1; k <= members_; ++k) {
          if (member_id(k) == leader) return k;
        }
      } catch (const std::exception&) {
        // a dead member, or not ready: ask the next one
      }
    }
    return std::nullopt;
  }

 private:
  static std::string scripts() { return DLAUNCH_CLUSTER_SCRIPTS; }
  std::string member_dir(int i) const {
    return members_ == 1 ? dir_ : dir_ + "/member" + std::to_string(i);
  }
  static std::string first_line(const std::string& path) {
    std::string line;
    std::ifstream f(path);
    std::getline(f, line);
    return line;
  }
  static std::string read(const std::string& path) {
    std::ifstream f(path);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  // Member i's id as etcd reports it (decimal, as the gateway writes uint64s), asked of member i
  // itself; empty when it does not answer.
  std::string member_id(int i) const {
    etcd::ClientOptions o;
    o.endpoint = member_endpoint(i);
    o.connect_timeout = std::chrono::seconds(1);
    o.request_timeout = std::chrono::seconds(2);
    try {
      auto j = nlohmann::json::parse(etcd::Client(o).call("/v3/maintenance/status", "{}"));
      return j["header"].value("member_id", "");
    } catch (const std::exception&) {
      return "";
    }
  }

  int members_;
  std::string dir_;
  std::string endpoints_;
  bool ok_ = false;
};

}  // namespace dlaunch::test
