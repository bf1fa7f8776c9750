// dlaunch's TcpStoreClient against PyTorch 2.15's own store servers (libuv, the default, and the
// legacy one, use_libuv=False), hosted by the venv's python as torchrun's agent hosts them:
//  - every request dlaunch's agents and workers make, compared call by call (results, and which
//    error) with the same calls against dlaunch's own server;
//  - an agent's connection, whose handshake carries dlaunch's DECLARE_AGENT (or AUTH_BEGIN with
//    a job token), which PyTorch's servers answer by closing the connection: refused at once,
//    with one sentence that names PyTorch's store, rather than retried for the join timeout;
//  - a dlaunch agent whose c10d --rdzv_endpoint is such a store (torchrun's store host): it
//    stops with that sentence and exit status 2.
// Skipped, saying why, where the venv scripts/setup_torch2.sh makes is absent.
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "common/error.h"
#include "rendezvous/tcp/tcp_store_client.h"
#include "rendezvous/tcp/tcp_store_server.h"
#include "tests/support/subprocess.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;
using testing::Subprocess;

const std::string kTorch2Python = DLAUNCH_TORCH2_PYTHON;
const std::string kStoreHostScript = TORCH2_STORE_HOST_SCRIPT;
const std::string kDlaunch = DLAUNCH_BIN;

std::string torch2_missing() {
  if (::access(kTorch2Python.c_str(), X_OK) != 0) {
    return kTorch2Python + " does not exist: run scripts/setup_torch2.sh (scripts/test.sh does) " +
           "or configure with -DDLAUNCH_TORCH2_PYTHON=<a python with torch 2.x>";
  }
  return "";
}

// PyTorch's store server, in its own process for the test's duration.
class PytorchStoreHost {
 public:
  explicit PytorchStoreHost(const std::string& backend)
      : process_({kTorch2Python, kStoreHostScript, backend}, {{"TORCH_CPP_LOG_LEVEL", "ERROR"}}) {
    std::smatch m;
    static const std::regex port_re(R"(port (\d+))");
    testing::wait_until(
        [&] {
          std::string out = process_.out();
          if (!std::regex_search(out, m, port_re)) return !testing::process_alive(process_.pid());
          port_ = static_cast<uint16_t>(std::stoi(m[1]));
          return true;
        },
        180s);
  }
  uint16_t port() const { return port_; }
  std::string log() const { return process_.out() + process_.err(); }

 private:
  Subprocess process_;
  uint16_t port_ = 0;
};

TcpStoreClientOptions options_for(uint16_t port) {
  TcpStoreClientOptions o;
  o.port = port;
  o.connect_timeout = 60s;
  o.timeout = 2s;  // the timed-out get/wait/multi_get below
  return o;
}

// What `call` returned, or which error it threw (the type, not the message: the messages name
// the port).
std::string outcome(const std::function<std::string()>& call) {
  try {
    return call();
  } catch (const TimeoutError&) {
    return "TimeoutError";
  } catch (const ClosedError&) {
    return "ClosedError";
  } catch (const Error& e) {
    return std::string("Error: ") + e.what();
  }
}

std::string str(const Bytes& b) { return "'" + to_string(b) + "'"; }
std::string str(const std::vector<Bytes>& values) {
  std::string out = "[";
  for (const auto& v : values) out += str(v) + " ";
  return out + "]";
}

// Every request dlaunch's agents and workers send (rendezvous, keep-alive, events, bootstrap,
// hang exchange), with the edge cases they rely on: one line per call.
std::vector<std::string> transcript(uint16_t port) {
  TcpStoreClient c(options_for(port));
  std::vector<std::string> lines;
  auto note = [&](const std::string& what, const std::function<std::string()>& call) {
    lines.push_back(what + " -> " + outcome(call));
  };
  note("ping", [&] { return std::to_string(c.ping()); });
  note("set a", [&] { c.set("a", to_bytes("1")); return std::string("ok"); });
  note("get a", [&] { return str(c.get("a")); });
  note("set a again", [&] { c.set("a", to_bytes("two")); return std::string("ok"); });
  note("get a", [&] { return str(c.get("a")); });
  note("set empty", [&] { c.set("empty", {}); return std::string("ok"); });
  note("get empty", [&] { return str(c.get("empty")); });
  note("get missing (times out)", [&] { return str(c.get("missing")); });
  note("get a after the timeout", [&] { return str(c.get("a")); });
  note("add n 5", [&] { return std::to_string(c.add("n", 5)); });
  note("add n -7", [&] { return std::to_string(c.add("n", -7)); });
  note("add n 0", [&] { return std::to_string(c.add("n", 0)); });
  note("get n", [&] { return str(c.get("n")); });
  note("compare_set missing '' -> x", [&] { return str(c.compare_set("cs", {}, to_bytes("x"))); });
  note("compare_set x -> y",
       [&] { return str(c.compare_set("cs", to_bytes("x"), to_bytes("y"))); });
  note("compare_set stale x -> z",
       [&] { return str(c.compare_set("cs", to_bytes("x"), to_bytes("z"))); });
  note("compare_set missing 'e' -> d",
       [&] { return str(c.compare_set("cs2", to_bytes("e"), to_bytes("d"))); });
  note("check cs2", [&] { return std::to_string(c.check({"cs2"})); });
  note("check a n", [&] { return std::to_string(c.check({"a", "n"})); });
  note("check a missing", [&] { return std::to_string(c.check({"a", "missing"})); });
  note("wait a n", [&] { c.wait({"a", "n"}, 2s); return std::string("ok"); });
  note("wait missing (times out)", [&] { c.wait({"a", "missing"}, 1s); return std::string("ok"); });
  note("get a after the wait's timeout", [&] { return str(c.get("a")); });
  note("multi_set k1 k2", [&] {
    c.multi_set({"k1", "k2"}, {to_bytes("v1"), to_bytes("v2")});
    return std::string("ok");
  });
  note("multi_get k1 k2 a", [&] { return str(c.multi_get({"k1", "k2", "a"})); });
  note("multi_get k1 missing (times out)", [&] { return str(c.multi_get({"k1", "missing"})); });
  note("append ap (new)", [&] { c.append("ap", to_bytes("x")); return std::string("ok"); });
  note("append ap", [&] { c.append("ap", to_bytes("yz")); return std::string("ok"); });
  note("get ap", [&] { return str(c.get("ap")); });
  note("wait_get k1 missing", [&] {
    auto r = c.wait_get({"k1", "missing"}, 2s);
    std::string out = std::to_string(r.ready);
    for (const auto& v : r.values) out += " " + (v ? str(*v) : std::string("-"));
    return out;
  });
  note("wait_get missing (times out)", [&] {
    auto r = c.wait_get({"missing", "k1"}, 1s);
    return std::to_string(r.ready) + " " + std::to_string(r.values.size());
  });
  note("num_keys", [&] { return std::to_string(c.num_keys()); });
  note("delete_key k1", [&] { return std::to_string(c.delete_key("k1")); });
  note("delete_key k1 again", [&] { return std::to_string(c.delete_key("k1")); });
  note("num_keys", [&] { return std::to_string(c.num_keys()); });
  // A second connection sees the first one's keys (a worker of another node, an agent's
  // second thread).
  TcpStoreClient other(options_for(port));
  note("other: get k2", [&] { return str(other.get("k2")); });
  note("other: add n 1", [&] { return std::to_string(other.add("n", 1)); });
  note("get n", [&] { return str(c.get("n")); });
  return lines;
}

std::string side_by_side(const std::vector<std::string>& ours,
                         const std::vector<std::string>& theirs) {
  std::string text = "ours | PyTorch's:\n";
  for (size_t i = 0; i < std::max(ours.size(), theirs.size()); ++i) {
    const std::string a = i < ours.size() ? ours[i] : "(none)";
    const std::string b = i < theirs.size() ? theirs[i] : "(none)";
    text += (a == b ? "   " : "!! ") + a + (a == b ? "" : "  |  " + b) + "\n";
  }
  return text;
}

class ClientAgainstPytorchServer : public ::testing::TestWithParam<std::string> {};

TEST_P(ClientAgainstPytorchServer, EveryRequestAnswersAsOurOwnServerDoes) {
  if (auto why = torch2_missing(); !why.empty()) GTEST_SKIP() << why;
  PytorchStoreHost pytorch(GetParam());
  ASSERT_NE(pytorch.port(), 0) << "PyTorch's store did not start\n" << pytorch.log();
  TcpStoreServer ours_server(TcpStoreServerOptions{});
  auto ours = transcript(ours_server.start());
  auto theirs = transcript(pytorch.port());
  EXPECT_EQ(ours, theirs) << side_by_side(ours, theirs);
  // And the transcript says what a store must: not two equally wrong servers.
  EXPECT_NE(std::find(ours.begin(), ours.end(), "add n -7 -> -2"), ours.end());
  EXPECT_NE(std::find(ours.begin(), ours.end(), "get ap -> 'xyz'"), ours.end());
  EXPECT_NE(std::find(ours.begin(), ours.end(), "get missing (times out) -> TimeoutError"),
            ours.end());
}

// An agent's handshake against PyTorch's store: refused at once with the sentence (not a
// ClosedError retried until connect_timeout, then "cannot reach the store").
TEST_P(ClientAgainstPytorchServer, AgentConnectionIsRefusedWithOneSentence) {
  if (auto why = torch2_missing(); !why.empty()) GTEST_SKIP() << why;
  PytorchStoreHost pytorch(GetParam());
  ASSERT_NE(pytorch.port(), 0) << "PyTorch's store did not start\n" << pytorch.log();
  for (bool with_token : {false, true}) {
    TcpStoreClientOptions o = options_for(pytorch.port());
    o.agent = true;
    o.run_id = "job";
    o.connect_timeout = 120s;
    if (with_token) o.token = std::string(64, 'a');
    try {
      TcpStoreClient agent(o);
      ADD_FAILURE() << "an agent connected to PyTorch's store (token: " << with_token << ")";
    } catch (const UsageError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("is not a dlaunch store"), std::string::npos) << what;
      EXPECT_NE(what.find("PyTorch's own TCPStore"), std::string::npos) << what;
      EXPECT_NE(what.find(with_token ? "AUTH_BEGIN" : "DECLARE_AGENT"), std::string::npos)
          << what;
    } catch (const Error& e) {
      ADD_FAILURE() << "token: " << with_token << ": expected the refusal, got: " << e.what();
    }
  }
}

// torchrun's agent hosts the store at the endpoint; a dlaunch agent given that endpoint for c10d
// stops with the sentence and exit status 2 (a usage error: the endpoint is wrong).
TEST_P(ClientAgainstPytorchServer, C10dAgentOnTorchrunsStoreStopsWithTheSentence) {
  if (auto why = torch2_missing(); !why.empty()) GTEST_SKIP() << why;
  PytorchStoreHost pytorch(GetParam());
  ASSERT_NE(pytorch.port(), 0) << "PyTorch's store did not start\n" << pytorch.log();
  auto r = testing::run({kDlaunch, "--nnodes", "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                         "127.0.0.1:" + std::to_string(pytorch.port()), "--rdzv_id", "job",
                         "--no_python", "true"},
                        {}, 180s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit.shell_code(), 2) << r.err;
  EXPECT_NE(r.err.find("is not a dlaunch store"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("PyTorch's own TCPStore"), std::string::npos) << r.err;
}

INSTANTIATE_TEST_SUITE_P(Torch215, ClientAgainstPytorchServer,
                         ::testing::Values("libuv", "legacy"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace dlaunch
