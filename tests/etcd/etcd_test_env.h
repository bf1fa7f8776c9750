// Where the cluster tests find the private etcd: $DLAUNCH_ETCD_ENDPOINT when set (by hand:
// `source DIR/env.sh` after tests/cluster/start_etcd.sh DIR), else the one the ctest fixture
// started in DLAUNCH_TEST_ETCD_DIR. Tests skip, with the reason, when neither is there.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <string>

#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_store.h"

namespace dlaunch::test {

struct EtcdLocation {
  std::string endpoint;     // empty: none
  std::string skip_reason;  // why not, when endpoint is empty
};

inline EtcdLocation find_test_etcd() {
  if (const char* e = std::getenv("DLAUNCH_ETCD_ENDPOINT"); e != nullptr && *e != '\0') {
    return {e, ""};
  }
#ifdef DLAUNCH_TEST_ETCD_DIR
  const std::string dir = DLAUNCH_TEST_ETCD_DIR;
  std::string line;
  if (std::ifstream skip(dir + "/skip"); skip && std::getline(skip, line)) return {"", line};
  if (std::ifstream ep(dir + "/endpoint"); ep && std::getline(ep, line) && !line.empty()) {
    return {line, ""};
  }
  return {"",
          "no etcd running: run these tests through `ctest -L cluster` (its fixture starts "
          "one), or start one with tests/cluster/start_etcd.sh " +
              dir};
#else
  return {"",
          "DLAUNCH_ETCD_ENDPOINT is not set; start etcd with tests/cluster/start_etcd.sh DIR "
          "and source DIR/env.sh"};
#endif
}

// A key prefix no other test (or earlier run) uses.
inline std::string unique_prefix(const std::string& name) {
  static std::mt19937_64 rng(std::random_device{}() ^ static_cast<uint64_t>(getpid()));
  return "/dlaunch-test/" + name + "/" + std::to_string(rng()) + "/";
}

// A test against the private etcd: skips with the reason when there is none; each test gets its
// own key prefix, and stores or clients of its own (as separate agents would have).
class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto where = find_test_etcd();
    if (where.endpoint.empty()) GTEST_SKIP() << where.skip_reason;
    endpoint_ = where.endpoint;
    prefix_ = unique_prefix(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  std::shared_ptr<etcd::Client> make_client() {
    etcd::ClientOptions o;
    o.endpoint = endpoint_;
    return std::make_shared<etcd::Client>(o);
  }
  std::shared_ptr<EtcdStore> make_store() { return std::make_shared<EtcdStore>(make_client(), prefix_); }

  std::string endpoint_;
  std::string prefix_;
};

}  // namespace dlaunch::test
