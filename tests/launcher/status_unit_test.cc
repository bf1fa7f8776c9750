// The pure parts of the status endpoint and job control: the node status model and its two
// formats, the control nonces and proofs, the timeline file and its merge, request parsing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launcher/status/control_auth.h"
#include "launcher/status/job_events.h"
#include "launcher/status/node_status.h"
#include "launcher/status/status_server.h"
#include "tests/support/subprocess.h"

namespace dlaunch {
namespace {

NodeStatus sample() {
  NodeStatus s;
  s.run_id = "job\"1";
  s.host = "node-a";
  s.agent_pid = 42;
  s.phase = "running";
  s.attempt = 2;
  s.round = 3;
  s.node_rank = 1;
  s.nnodes = 2;
  s.world_size = 4;
  s.restarts = 2;
  s.max_restarts = 5;
  s.agent_usage = ProcUsage{7 << 20, 0.25, 2};
  WorkerStatus w;
  w.global_rank = 2;
  w.local_rank = 0;
  w.pid = 100;
  w.state = "running";
  w.start_time = 1700000000.5;
  w.restarts = 2;
  w.heartbeat_age_seconds = 0.75;
  w.usage = ProcUsage{1 << 20, 1.5, 3};
  s.workers.push_back(w);
  WorkerStatus x = w;
  x.global_rank = 3;
  x.local_rank = 1;
  x.state = "failed";
  x.heartbeat_age_seconds.reset();
  x.usage.reset();
  x.exit_code = 3;
  x.replacements = 1;  // replaced alone once (--restart_scope rank)
  s.workers.push_back(x);
  StoreStats stats;
  stats.record(wire::Op::kAdd, false, std::chrono::microseconds(5), 9);
  s.store = stats.snapshot();
  s.store->connections = 4;
  s.store->connections_peak = 7;
  s.store->connections_accepted = 11;
  s.store->channels_opened = 6;
  return s;
}

TEST(NodeStatus, JsonRoundTrips) {
  NodeStatus s = sample();
  NodeStatus back = node_status_from_json(nlohmann::json::parse(node_status_json(s).dump()));
  EXPECT_EQ(back.run_id, s.run_id);
  EXPECT_EQ(back.host, "node-a");
  EXPECT_EQ(back.attempt, 2);
  EXPECT_EQ(back.round, 3);
  EXPECT_EQ(back.node_rank, 1);
  ASSERT_EQ(back.workers.size(), 2u);
  EXPECT_EQ(back.workers[0].pid, 100);
  EXPECT_DOUBLE_EQ(*back.workers[0].heartbeat_age_seconds, 0.75);
  EXPECT_EQ(back.workers[0].usage->rss_bytes, 1 << 20);
  EXPECT_FALSE(back.workers[1].heartbeat_age_seconds);
  EXPECT_EQ(*back.workers[1].exit_code, 3);
  EXPECT_EQ(back.workers[0].replacements, 0);
  EXPECT_EQ(back.workers[1].replacements, 1);
  ASSERT_TRUE(back.store);
  EXPECT_EQ(back.store->keys, 9);
  EXPECT_EQ(back.store->connections, 4);
  EXPECT_EQ(back.store->connections_peak, 7);
  EXPECT_EQ(back.store->connections_accepted, 11);
  EXPECT_EQ(back.store->channels_opened, 6);
  EXPECT_EQ(back.store->worker_requests_by_op, s.store->worker_requests_by_op);
  EXPECT_EQ(back.store->worker_requests_by_op.at("ADD"), 1);
}

TEST(NodeStatus, PrometheusHasHelpTypeAndLabels) {
  std::string text = to_prometheus(sample());
  EXPECT_NE(text.find("# HELP dlaunch_worker_up "), std::string::npos);
  EXPECT_NE(text.find("# TYPE dlaunch_worker_up gauge"), std::string::npos);
  EXPECT_NE(text.find("# TYPE dlaunch_restarts_total counter"), std::string::npos);
  // Quotes in label values are escaped.
  EXPECT_NE(text.find("dlaunch_worker_up{run_id=\"job\\\"1\",node=\"node-a\",node_rank=\"1\","
                      "rank=\"2\",local_rank=\"0\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rank=\"3\",local_rank=\"1\"} 3"), std::string::npos) << text;  // exit code
  EXPECT_NE(text.find("dlaunch_store_request_duration_seconds_bucket{"), std::string::npos);
  EXPECT_NE(text.find("client=\"worker\",op=\"ADD\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("le=\"+Inf\"} 1"), std::string::npos) << text;
  // Every sample line belongs to a family announced before it.
  std::istringstream in(text);
  std::string line, family;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) family = line.substr(7, line.find(' ', 7) - 7);
    if (line.empty() || line[0] == '#') continue;
    EXPECT_EQ(line.rfind(family, 0), 0u) << line;
  }
}

TEST(NodeStatus, ReadsThisProcessFromProc) {
  auto u = read_proc_usage(static_cast<int>(::getpid()));
  ASSERT_TRUE(u);
  EXPECT_GT(u->rss_bytes, 0);
  EXPECT_GE(u->threads, 1);
  EXPECT_FALSE(read_proc_usage(0));
}

TEST(ControlAuth, AcceptsAProofOnceForItsAction) {
  ControlNonces nonces;
  auto now = std::chrono::steady_clock::now();
  std::string n = nonces.issue("stop", now);
  ControlProof p = prove_control("secret", n);
  EXPECT_EQ(nonces.check("secret", "stop", n, p.client_nonce_hex, p.proof_hex, now), "");
  // The same request again: the nonce is spent.
  EXPECT_NE(nonces.check("secret", "stop", n, p.client_nonce_hex, p.proof_hex, now), "");
}

TEST(ControlAuth, RefusesWrongTokenActionExpiryAndMissingProof) {
  ControlNonces nonces;
  auto now = std::chrono::steady_clock::now();
  std::string n1 = nonces.issue("stop", now);
  ControlProof p1 = prove_control("wrong", n1);
  EXPECT_EQ(nonces.check("secret", "stop", n1, p1.client_nonce_hex, p1.proof_hex, now),
            "wrong job token");
  std::string n2 = nonces.issue("dump", now);
  ControlProof p2 = prove_control("secret", n2);
  EXPECT_NE(nonces.check("secret", "stop", n2, p2.client_nonce_hex, p2.proof_hex, now), "");
  std::string n3 = nonces.issue("stop", now);
  ControlProof p3 = prove_control("secret", n3);
  EXPECT_EQ(nonces.check("secret", "stop", n3, p3.client_nonce_hex, p3.proof_hex,
                         now + ControlNonces::kLifetime + std::chrono::seconds(1)),
            "the nonce expired");
  EXPECT_NE(nonces.check("secret", "stop", "", "", "", now), "");
}

TEST(ControlAuth, HexRoundTrips) {
  wire::Digest d{};
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(i * 7);
  EXPECT_EQ(*digest_from_hex(to_hex(d)), d);
  EXPECT_FALSE(digest_from_hex("xyz"));
}

TEST(JobEvents, AppendsOneObjectPerLineAndMergesByTime) {
  testing::TempDir dir;
  {
    JobEvents a;
    a.open(dir.file("a.jsonl"), "node-a", 1);
    JobEvents b;
    b.open(dir.file("b.jsonl"), "node-b", 2);
    a.emit("first", {{"rank", 0}});
    b.emit("second");
    a.emit("third", {{"why", "x y"}});
  }
  std::string ta = testing::read_file(dir.file("a.jsonl"));
  std::string tb = testing::read_file(dir.file("b.jsonl"));
  auto la = parse_timeline(ta);
  ASSERT_EQ(la.size(), 2u);
  EXPECT_EQ(la[0]["event"], "first");
  EXPECT_EQ(la[0]["host"], "node-a");
  EXPECT_EQ(la[0]["rank"], 0);
  EXPECT_TRUE(la[0].contains("mono"));
  EXPECT_TRUE(la[0].contains("time_iso"));
  auto merged = merge_timelines({la, parse_timeline(tb)});
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[0]["event"], "first");
  EXPECT_EQ(merged[1]["event"], "second");
  EXPECT_EQ(merged[2]["event"], "third");
  std::string line = format_event_line(merged[2]);
  EXPECT_NE(line.find("node-a[1] third why=x y"), std::string::npos) << line;
}

TEST(StatusServer, RequestQueryAndLoopbackPeers) {
  HttpRequest r;
  r.target = "/control/nonce?action=stop&x=1";
  EXPECT_EQ(r.path(), "/control/nonce");
  EXPECT_EQ(r.query("action"), "stop");
  EXPECT_EQ(r.query("x"), "1");
  EXPECT_EQ(r.query("y"), "");
  EXPECT_TRUE(is_loopback_peer("127.0.0.1:5000"));
  EXPECT_TRUE(is_loopback_peer("[::1]:5000"));
  EXPECT_FALSE(is_loopback_peer("10.1.2.3:5000"));
}

}  // namespace
}  // namespace dlaunch
