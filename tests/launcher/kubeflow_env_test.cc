// `dlaunch` with no flags in the environment each Kubernetes controller gives a pod: every
// variable the controller sets, with the value it sets it to (docs/kubernetes.md cites the
// controller's source for each), and nothing else but Kubernetes' own.
#include <gtest/gtest.h>

#include <map>

#include "common/error.h"
#include "launcher/config/kubernetes_env.h"
#include "launcher/config/config_resolution.h"
#include "launcher/config/launch_config.h"

namespace dlaunch {
namespace {

using Env = std::map<std::string, std::string>;

// What Kubernetes gives every container, whatever made its pod.
const Env kEveryPod = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                       {"KUBERNETES_SERVICE_PORT", "443"},
                       {"HOSTNAME", "pod"}};

Env pod(Env controller) {
  controller.insert(kEveryPod.begin(), kEveryPod.end());
  return controller;
}

EnvLookup lookup(const Env& env) {
  return [env](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

// No flag at all: the program only. The host has 8 GPUs and 32 cores.
LaunchConfig no_flags(const Env& env) {
  return resolve_config(parse_cli({"/bin/true"}), lookup(env),
                        HostInfo{32, 8, "feedfacecafebeef", "pod"});
}

std::string usage_error(const Env& env) {
  try {
    no_flags(env);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// Trainer v2 (pkg/runtime/framework/plugins/torch/torch.go): TrainJob "mnist", numNodes 2, GPUs
// per node, so PET_NPROC_PER_NODE stays "auto"; PET_NODE_RANK is the Job completion index
// (a fieldRef), and JobSet's Jobs being indexed, Kubernetes adds JOB_COMPLETION_INDEX.
TEST(KubeflowEnv, TrainerV2TrainJob) {
  for (int rank : {0, 1}) {
    auto c = no_flags(pod({{"PET_NNODES", "2"},
                           {"PET_NPROC_PER_NODE", "auto"},
                           {"PET_NODE_RANK", std::to_string(rank)},
                           {"PET_MASTER_ADDR", "mnist-node-0-0.mnist"},
                           {"PET_MASTER_PORT", "29500"},
                           {"JOB_COMPLETION_INDEX", std::to_string(rank)}}));
    EXPECT_EQ(c.min_nodes, 2);
    EXPECT_EQ(c.max_nodes, 2);
    EXPECT_EQ(c.origin.at("nnodes"), "PET_NNODES");
    EXPECT_EQ(c.nproc_per_node, 8);  // auto: the GPUs
    EXPECT_EQ(c.origin.at("nproc_per_node"), "PET_NPROC_PER_NODE");
    EXPECT_EQ(c.node_rank, rank);
    EXPECT_TRUE(c.node_rank_given);
    EXPECT_EQ(c.origin.at("node_rank"), "PET_NODE_RANK");
    EXPECT_EQ(c.master_addr, "mnist-node-0-0.mnist");
    EXPECT_EQ(c.origin.at("master_addr"), "PET_MASTER_ADDR");
    EXPECT_EQ(c.master_port, 29500);
    EXPECT_EQ(c.origin.at("master_port"), "PET_MASTER_PORT");
    EXPECT_EQ(c.rdzv_backend, "static");
    EXPECT_FALSE(c.standalone);
  }
  // Without GPUs in the node's resources the plugin counts CPUs itself: a number.
  auto c = no_flags(pod({{"PET_NNODES", "2"},
                         {"PET_NPROC_PER_NODE", "4"},
                         {"PET_NODE_RANK", "1"},
                         {"PET_MASTER_ADDR", "mnist-node-0-0.mnist"},
                         {"PET_MASTER_PORT", "29500"},
                         {"JOB_COMPLETION_INDEX", "1"}}));
  EXPECT_EQ(c.nproc_per_node, 4);
}

// v1 PyTorchJob without elasticPolicy (Training Operator 1.7 to 1.9, pkg/controller.v1/pytorch/
// envvar.go and master.go): Master 1 + Worker 3, nprocPerNode "2", the default port 23456.
// This is worker 1's pod: RANK and PET_NODE_RANK are 2 (workers count from 1, after the
// master), and WORLD_SIZE is 4 pods x 2 processes = 8, which is not the node count.
TEST(KubeflowEnv, PyTorchJobV1NonElastic) {
  Env env = pod({{"PYTHONUNBUFFERED", "1"},
                 {"MASTER_PORT", "23456"},
                 {"PET_MASTER_PORT", "23456"},
                 {"MASTER_ADDR", "mnist-master-0"},
                 {"PET_MASTER_ADDR", "mnist-master-0"},
                 {"WORLD_SIZE", "8"},
                 {"RANK", "2"},
                 {"PET_NODE_RANK", "2"},
                 {"PET_NPROC_PER_NODE", "2"},
                 {"PET_NNODES", "4"}});
  EXPECT_FALSE(is_legacy_pytorchjob_pod(lookup(env)));
  auto c = no_flags(env);
  EXPECT_EQ(c.min_nodes, 4);
  EXPECT_EQ(c.max_nodes, 4);
  EXPECT_EQ(c.origin.at("nnodes"), "PET_NNODES");
  EXPECT_EQ(c.nproc_per_node, 2);
  EXPECT_EQ(c.node_rank, 2);
  EXPECT_EQ(c.origin.at("node_rank"), "PET_NODE_RANK");
  EXPECT_EQ(c.master_addr, "mnist-master-0");
  EXPECT_EQ(c.master_port, 23456);
  EXPECT_EQ(c.origin.at("master_port"), "PET_MASTER_PORT");
  EXPECT_EQ(c.rdzv_backend, "static");
}

// The same job under an operator before 1.7: no PET_* at all. WORLD_SIZE then counted pods
// (one process each) and RANK was the pod's index, so they are the node count and rank.
TEST(KubeflowEnv, PyTorchJobBeforeTrainingOperator17) {
  Env env = pod({{"PYTHONUNBUFFERED", "0"},
                 {"MASTER_PORT", "23456"},
                 {"MASTER_ADDR", "mnist-master-0"},
                 {"WORLD_SIZE", "4"},
                 {"RANK", "2"}});
  EXPECT_TRUE(is_legacy_pytorchjob_pod(lookup(env)));
  auto c = no_flags(env);
  EXPECT_EQ(c.min_nodes, 4);
  EXPECT_EQ(c.max_nodes, 4);
  EXPECT_EQ(c.origin.at("nnodes"), "WORLD_SIZE (PyTorchJob before 1.7: its pod count)");
  EXPECT_EQ(c.node_rank, 2);
  EXPECT_TRUE(c.node_rank_given);
  EXPECT_EQ(c.origin.at("node_rank"), "RANK (PyTorchJob before 1.7: this pod's index)");
  EXPECT_EQ(c.master_addr, "mnist-master-0");
  EXPECT_EQ(c.master_port, 23456);
  EXPECT_EQ(c.origin.at("master_port"), "MASTER_PORT (PyTorchJob before 1.7)");
  EXPECT_EQ(c.nproc_per_node, 1);  // as torchrun's default: the operator knew no nproc then

  // A worker of a launcher has the same four variables plus LOCAL_RANK: a dlaunch it starts
  // must not read its worker's ranks as node ranks.
  env["LOCAL_RANK"] = "0";
  EXPECT_FALSE(is_legacy_pytorchjob_pod(lookup(env)));
  env.erase("LOCAL_RANK");
  env["TORCHELASTIC_RUN_ID"] = "job7";
  EXPECT_FALSE(is_legacy_pytorchjob_pod(lookup(env)));
  // Outside Kubernetes the four variables mean nothing to dlaunch.
  env.erase("TORCHELASTIC_RUN_ID");
  env.erase("KUBERNETES_SERVICE_HOST");
  EXPECT_FALSE(is_legacy_pytorchjob_pod(lookup(env)));
  c = no_flags(env);
  EXPECT_EQ(c.max_nodes, 1);
  EXPECT_EQ(c.master_addr, "127.0.0.1");
}

// v1 PyTorchJob with elasticPolicy (pkg/controller.v1/pytorch/elastic.go): Worker 4 replicas,
// minReplicas 2, maxReplicas 4, rdzvBackend c10d, maxRestarts 3, rdzvId and rdzvConf given. The
// pods are plain pods: no rank, no completion index; the rendezvous numbers the nodes.
TEST(KubeflowEnv, PyTorchJobV1Elastic) {
  auto c = no_flags(pod({{"PYTHONUNBUFFERED", "1"},
                         {"PET_NPROC_PER_NODE", "auto"},
                         {"PET_RDZV_ENDPOINT", "elastic-worker-0:23456"},
                         {"PET_RDZV_BACKEND", "c10d"},
                         {"PET_NNODES", "2:4"},
                         {"PET_MAX_RESTARTS", "3"},
                         {"PET_RDZV_ID", "elastic"},
                         {"PET_RDZV_CONF", "join_timeout=300,last_call_timeout=10"}}));
  EXPECT_EQ(c.min_nodes, 2);
  EXPECT_EQ(c.max_nodes, 4);
  EXPECT_EQ(c.rdzv_backend, "c10d");
  EXPECT_EQ(c.origin.at("rdzv_backend"), "PET_RDZV_BACKEND");
  EXPECT_EQ(c.rdzv_endpoint, "elastic-worker-0:23456");
  EXPECT_EQ(c.origin.at("rdzv_endpoint"), "PET_RDZV_ENDPOINT");
  EXPECT_EQ(c.max_restarts, 3);
  EXPECT_EQ(c.origin.at("max_restarts"), "PET_MAX_RESTARTS");
  EXPECT_EQ(c.run_id, "elastic");
  EXPECT_EQ(c.origin.at("rdzv_id"), "PET_RDZV_ID");
  EXPECT_EQ(c.rdzv_conf, (std::map<std::string, std::string>{{"join_timeout", "300"},
                                                             {"last_call_timeout", "10"}}));
  EXPECT_EQ(c.origin.at("rdzv_conf"), "PET_RDZV_CONF");
  EXPECT_EQ(c.nproc_per_node, 8);
  EXPECT_FALSE(c.node_rank_given);
  EXPECT_FALSE(c.standalone);
}

// elasticPolicy.standalone: true on one worker. The controller sets PET_STANDALONE to "" (set,
// empty), which torchrun itself cannot parse; dlaunch reads it as on.
TEST(KubeflowEnv, PyTorchJobV1ElasticStandalone) {
  auto c = no_flags(pod({{"PYTHONUNBUFFERED", "1"},
                         {"PET_NPROC_PER_NODE", "auto"},
                         {"PET_RDZV_ENDPOINT", "solo-worker-0:23456"},
                         {"PET_RDZV_BACKEND", "c10d"},
                         {"PET_NNODES", "1:1"},
                         {"PET_STANDALONE", ""}}));
  EXPECT_TRUE(c.standalone);
  EXPECT_EQ(c.origin.at("standalone"), "PET_STANDALONE");
  EXPECT_EQ(c.max_nodes, 1);
  EXPECT_EQ(c.master_port, 0);  // a free port, as --standalone
  EXPECT_EQ(c.run_id, "feedfacecafebeef");
  // Standalone is one node: a range of several is refused, naming where it came from.
  std::string err = usage_error(pod({{"PET_RDZV_ENDPOINT", "solo-worker-0:23456"},
                                     {"PET_RDZV_BACKEND", "c10d"},
                                     {"PET_NNODES", "2:4"},
                                     {"PET_STANDALONE", ""}}));
  EXPECT_NE(err.find("--standalone is a single-node job but PET_NNODES='2:4'"), std::string::npos)
      << err;
  // DLAUNCH_STANDALONE keeps dlaunch's own rule: empty is not a boolean.
  EXPECT_NE(
      usage_error({{"DLAUNCH_STANDALONE", ""}}).find("DLAUNCH_STANDALONE='' is not a boolean"),
      std::string::npos);
}

// A plain indexed Job (completionMode: Indexed, completions 4) behind a headless Service
// "train": the manifest sets the PET_* it knows (examples/kubernetes/indexed-job.yaml) and
// Kubernetes adds the pod's JOB_COMPLETION_INDEX, the node rank.
TEST(KubeflowEnv, PlainIndexedJob) {
  for (int index : {0, 3}) {
    auto c = no_flags(pod({{"PET_NNODES", "4"},
                           {"PET_NPROC_PER_NODE", "auto"},
                           {"PET_MASTER_ADDR", "train-0.train"},
                           {"PET_MASTER_PORT", "29500"},
                           {"JOB_COMPLETION_INDEX", std::to_string(index)}}));
    EXPECT_EQ(c.max_nodes, 4);
    EXPECT_EQ(c.node_rank, index);
    EXPECT_TRUE(c.node_rank_given);
    EXPECT_EQ(c.origin.at("node_rank"), "JOB_COMPLETION_INDEX (an indexed Job's pod index)");
    EXPECT_EQ(c.master_addr, "train-0.train");
    EXPECT_EQ(c.rdzv_backend, "static");
  }
  // An explicit rank wins over the index.
  auto c = resolve_config(parse_cli({"--node_rank", "1", "/bin/true"}),
                          lookup(pod({{"PET_NNODES", "4"}, {"JOB_COMPLETION_INDEX", "3"}})),
                          HostInfo{32, 8, "feedfacecafebeef", "pod"});
  EXPECT_EQ(c.node_rank, 1);
}

// An indexed Job of one-node tasks (a sweep: each index its own shard or hyperparameters): in a
// one-node job the index names the task, not a node, so each pod runs its own job.
TEST(KubeflowEnv, IndexedJobOfOneNodeTasks) {
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"/bin/true"}, {"--standalone", "/bin/true"}}) {
    auto c = resolve_config(parse_cli(flags), lookup(pod({{"JOB_COMPLETION_INDEX", "3"}})),
                            HostInfo{32, 8, "feedfacecafebeef", "pod"});
    EXPECT_EQ(c.max_nodes, 1);
    EXPECT_EQ(c.node_rank, 0);
    EXPECT_FALSE(c.node_rank_given);
    EXPECT_EQ(c.origin.at("node_rank"), "default");
  }
  // An explicit rank past a default node count says what is missing.
  std::string err = usage_error(pod({{"PET_NODE_RANK", "1"}}));
  EXPECT_NE(err.find("PET_NODE_RANK=1 is not allowed with --nnodes=1"), std::string::npos) << err;
  EXPECT_NE(err.find("set it, or PET_NNODES, to the job's node count"), std::string::npos) << err;
}

}  // namespace
}  // namespace dlaunch
