// The real dlaunch as the entrypoint of a job's pods, with no flag at all: each pod gets exactly
// the environment its controller sets (and nothing else: env -i), its own host name (a UTS
// namespace), and the pods share a fresh network namespace whose /etc/hosts names every pod, as
// the cluster's DNS would. No cluster runs here; these are the Linux pieces underneath.
// Each test checks what `--dry_run` says and where each value came from, then launches the
// job and checks the ranks the workers got.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

const std::string kDlaunch = DLAUNCH_BIN;
const std::string kWorker = TEST_WORKER_BIN;

using Env = std::map<std::string, std::string>;

struct Pod {
  std::string hostname;
  Env env;  // what the controller sets
};

struct PodResult {
  std::string dry_run;  // --dry_run's stdout and stderr
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// One pod's command: its own host name, then dlaunch in exactly the controller's environment
// plus what Kubernetes gives every container.
std::string pod_command(const Pod& pod, bool dry_run) {
  std::string cmd =
      "unshare --uts sh -c " +
      quote("hostname " + pod.hostname +
            " && exec env -i PATH=/usr/bin:/bin "
            "KUBERNETES_SERVICE_HOST=10.96.0.1 KUBERNETES_SERVICE_PORT=443 HOSTNAME=" +
            pod.hostname + " \"$@\"") +
      " sh";
  for (const auto& [k, v] : pod.env) cmd += " " + quote(k + "=" + v);
  cmd += " " + quote(kDlaunch);
  if (dry_run) cmd += " --dry_run";
  cmd += " " + quote(kWorker) + " print-env";
  return cmd;
}

constexpr const char* kNoNamespaces = "this machine lets no test make user namespaces";

// Whether this machine lets a test make the pods' namespaces (user namespaces may be off).
bool can_make_pod_namespaces() {
  static const bool can = run({"/usr/bin/unshare", "--user", "--map-root-user", "--net", "--mount",
                               "--uts", "/bin/true"})
                              .exit.shell_code() == 0;
  return can;
}

// Runs every pod's --dry_run, then all pods at once, in one fresh network and mount namespace
// whose /etc/hosts maps `names` (and every pod's host name) to loopback.
std::vector<PodResult> run_pods(const std::vector<Pod>& pods, std::vector<std::string> names) {
  TempDir dir;
  std::string hosts = "127.0.0.1 localhost";
  for (const auto& p : pods) names.push_back(p.hostname);
  for (const auto& n : names) hosts += " " + n;
  std::string script =
      "set -e\nexport PATH=/usr/sbin:/usr/bin:/sbin:/bin\nip link set lo up\nprintf '%s\\n' " +
      quote(hosts) + " > " + quote(dir.file("hosts")) + "\nmount --bind " +
      quote(dir.file("hosts")) + " /etc/hosts\nset +e\n";
  for (size_t i = 0; i < pods.size(); ++i) {
    std::string n = std::to_string(i);
    script += pod_command(pods[i], true) + " > " + quote(dir.file("dry" + n)) + " 2>&1\n";
  }
  for (size_t i = 0; i < pods.size(); ++i) {
    std::string n = std::to_string(i);
    script += "(" + pod_command(pods[i], false) + " > " + quote(dir.file("out" + n)) + " 2> " +
              quote(dir.file("err" + n)) + "; echo $? > " + quote(dir.file("rc" + n)) + ") &\n";
  }
  script += "wait\n";
  // A user namespace maps this user to root inside, so that unprivileged runs may unshare too.
  auto r =
      run({"/usr/bin/unshare", "--user", "--map-root-user", "--net", "--mount", "sh", "-c", script},
          {}, std::chrono::seconds(180));
  std::vector<PodResult> results(pods.size());
  if (!file_exists(dir.file("dry0"))) {
    ADD_FAILURE() << "the pods' namespaces could not be set up (exit " << r.exit.shell_code()
                  << "): " << r.err;
    return results;
  }
  EXPECT_FALSE(r.timed_out) << r.err;
  for (size_t i = 0; i < pods.size(); ++i) {
    std::string n = std::to_string(i);
    results[i].dry_run = read_file(dir.file("dry" + n));
    if (file_exists(dir.file("rc" + n)))
      results[i].exit_code = std::stoi(read_file(dir.file("rc" + n)));
    results[i].out = read_file(dir.file("out" + n));
    results[i].err = read_file(dir.file("err" + n));
  }
  return results;
}

// The dry-run line of `setting`: "  node_rank              = 1    <- PET_NODE_RANK".
std::string dry_line(const std::string& dry_run, const std::string& setting) {
  for (const auto& line : lines_with_prefix(dry_run, "  " + setting + " ")) return line;
  return "";
}

void expect_setting(const PodResult& pod, const std::string& setting, const std::string& value,
                    const std::string& origin) {
  std::string line = dry_line(pod.dry_run, setting);
  EXPECT_NE(line.find("= " + value + " "), std::string::npos) << pod.dry_run;
  EXPECT_NE(line.find("<- " + origin), std::string::npos) << pod.dry_run;
}

// "[default1]:GROUP_RANK=1" lines -> local rank -> variable -> value.
std::map<int, Env> worker_env(const std::string& out) {
  std::map<int, Env> env;
  for (const auto& line : lines_with_prefix(out, "[default")) {
    size_t close = line.find("]:");
    size_t eq = line.find('=', close);
    if (close == std::string::npos || eq == std::string::npos) continue;
    env[std::stoi(line.substr(8, close - 8))][line.substr(close + 2, eq - close - 2)] =
        line.substr(eq + 1);
  }
  return env;
}

// Every pod exits 0; its two workers have the node rank `group_ranks[pod]` (or any distinct
// ones when empty: an elastic rendezvous numbers the nodes) and the job's global ranks are
// 0..2*pods-1.
void expect_job_ran(const std::vector<PodResult>& pods, const std::vector<int>& group_ranks) {
  std::set<std::string> ranks, groups;
  for (size_t i = 0; i < pods.size(); ++i) {
    ASSERT_EQ(pods[i].exit_code, 0) << "pod " << i << ":\n" << pods[i].err;
    auto env = worker_env(pods[i].out);
    ASSERT_EQ(env.size(), 2u) << pods[i].out;
    for (auto& [local_rank, e] : env) {
      EXPECT_EQ(e["WORLD_SIZE"], std::to_string(2 * pods.size())) << pods[i].out;
      if (!group_ranks.empty()) {
        EXPECT_EQ(e["GROUP_RANK"], std::to_string(group_ranks[i])) << pods[i].out;
      }
      ranks.insert(e["RANK"]);
      groups.insert(e["GROUP_RANK"]);
    }
  }
  EXPECT_EQ(ranks.size(), 2 * pods.size());
  EXPECT_EQ(groups.size(), pods.size());
}

// Trainer v2: TrainJob "mnist", numNodes 2, 2 CPUs a node (no GPU: the plugin writes the count).
TEST(KubeflowPods, TrainerV2TrainJob) {
  std::vector<Pod> pods;
  for (int rank : {0, 1}) {
    pods.push_back({"mnist-node-0-" + std::to_string(rank),
                    {{"PET_NNODES", "2"},
                     {"PET_NPROC_PER_NODE", "2"},
                     {"PET_NODE_RANK", std::to_string(rank)},
                     {"PET_MASTER_ADDR", "mnist-node-0-0.mnist"},
                     {"PET_MASTER_PORT", "29500"},
                     {"JOB_COMPLETION_INDEX", std::to_string(rank)}}});
  }
  if (!can_make_pod_namespaces())
    GTEST_SKIP() << "cannot make user, network and mount namespaces here";
  auto r = run_pods(pods, {"mnist-node-0-0.mnist"});
  expect_setting(r[1], "nnodes", "2", "PET_NNODES");
  expect_setting(r[1], "node_rank", "1", "PET_NODE_RANK");
  expect_setting(r[1], "master_addr", "mnist-node-0-0.mnist", "PET_MASTER_ADDR");
  expect_setting(r[0], "master_port", "29500", "PET_MASTER_PORT");
  expect_job_ran(r, {0, 1});
}

// v1 PyTorchJob "mnist" without elasticPolicy: Master 1 + Worker 1, nprocPerNode "2".
TEST(KubeflowPods, PyTorchJobV1NonElastic) {
  std::vector<Pod> pods;
  for (int rank : {0, 1}) {
    pods.push_back({rank == 0 ? "mnist-master-0" : "mnist-worker-0",
                    {{"PYTHONUNBUFFERED", "1"},
                     {"MASTER_PORT", "23456"},
                     {"PET_MASTER_PORT", "23456"},
                     {"MASTER_ADDR", "mnist-master-0"},
                     {"PET_MASTER_ADDR", "mnist-master-0"},
                     {"WORLD_SIZE", "4"},
                     {"RANK", std::to_string(rank)},
                     {"PET_NODE_RANK", std::to_string(rank)},
                     {"PET_NPROC_PER_NODE", "2"},
                     {"PET_NNODES", "2"}}});
  }
  if (!can_make_pod_namespaces())
    GTEST_SKIP() << "cannot make user, network and mount namespaces here";
  auto r = run_pods(pods, {});
  expect_setting(r[1], "nnodes", "2", "PET_NNODES");
  expect_setting(r[1], "node_rank", "1", "PET_NODE_RANK");
  expect_setting(r[1], "master_port", "23456", "PET_MASTER_PORT");
  expect_job_ran(r, {0, 1});
}

// v1 PyTorchJob "elastic" with elasticPolicy: Worker 2 replicas, minReplicas 2, maxReplicas 4,
// maxRestarts 3, rdzvConf last_call_timeout=1.
TEST(KubeflowPods, PyTorchJobV1Elastic) {
  std::vector<Pod> pods;
  for (int i : {0, 1}) {
    pods.push_back({"elastic-worker-" + std::to_string(i),
                    {{"PYTHONUNBUFFERED", "1"},
                     {"PET_NPROC_PER_NODE", "2"},
                     {"PET_RDZV_ENDPOINT", "elastic-worker-0:23456"},
                     {"PET_RDZV_BACKEND", "c10d"},
                     {"PET_NNODES", "2:4"},
                     {"PET_MAX_RESTARTS", "3"},
                     {"PET_RDZV_CONF", "last_call_timeout=1"}}});
  }
  if (!can_make_pod_namespaces())
    GTEST_SKIP() << "cannot make user, network and mount namespaces here";
  auto r = run_pods(pods, {});
  expect_setting(r[1], "nnodes", "2:4", "PET_NNODES");
  expect_setting(r[1], "rdzv_backend", "c10d", "PET_RDZV_BACKEND");
  expect_setting(r[1], "rdzv_endpoint", "elastic-worker-0:23456", "PET_RDZV_ENDPOINT");
  expect_setting(r[1], "max_restarts", "3", "PET_MAX_RESTARTS");
  expect_job_ran(r, {});
}

// A plain indexed Job "train" (completions 2) behind the headless Service "train": the manifest
// sets the PET_* it knows; the node rank is Kubernetes' JOB_COMPLETION_INDEX.
TEST(KubeflowPods, PlainIndexedJob) {
  std::vector<Pod> pods;
  for (int index : {0, 1}) {
    pods.push_back({"train-" + std::to_string(index),
                    {{"PET_NNODES", "2"},
                     {"PET_NPROC_PER_NODE", "2"},
                     {"PET_MASTER_ADDR", "train-0.train"},
                     {"PET_MASTER_PORT", "29500"},
                     {"JOB_COMPLETION_INDEX", std::to_string(index)}}});
  }
  if (!can_make_pod_namespaces())
    GTEST_SKIP() << "cannot make user, network and mount namespaces here";
  auto r = run_pods(pods, {"train-0.train"});
  expect_setting(r[0], "node_rank", "0", "JOB_COMPLETION_INDEX");
  expect_setting(r[1], "node_rank", "1", "JOB_COMPLETION_INDEX");
  expect_job_ran(r, {0, 1});
}

}  // namespace
}  // namespace dlaunch::testing
