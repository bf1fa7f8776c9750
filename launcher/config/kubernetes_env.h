// What Kubernetes and Kubeflow's training controllers tell a pod about its job beyond the PET_*
// twins torchrun reads, so that `dlaunch` with no flags does the right thing as a pod's
// entrypoint. launch_config.cc asks here only after a flag, its DLAUNCH_* twin and its PET_*
// twin all left a setting unset. docs/kubernetes.md lists what each controller sets and why
// each rule below holds.
//
//   --node_rank   <- JOB_COMPLETION_INDEX, the pod's index in an indexed Job (a plain indexed
//                    Job; JobSet's Jobs, hence Trainer v2's, are indexed Jobs too), in a job of
//                    several nodes only: in a one-node job the index names an independent task
//                    of the Job (a sweep, a shard), not a node.
//   A PyTorchJob pod of Training Operator before 1.7, which sets no PET_* variable at all:
//   --nnodes      <- WORLD_SIZE  (the pod count: it ran one process per pod)
//   --node_rank   <- RANK        (the pod's index, master 0, worker i is i + 1)
//   --master_addr <- MASTER_ADDR (<job>-master-0)
//   --master_port <- MASTER_PORT
//
// Pure: the environment is passed in.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace dlaunch {

using KubernetesEnv = std::function<std::optional<std::string>(const std::string&)>;

struct KubernetesValue {
  std::string text;      // the variable's value
  std::string variable;  // "JOB_COMPLETION_INDEX": how errors name it
  std::string origin;    // what --dry_run shows: the variable and what it means
};

// The value a controller's variable gives flag `name` ("node_rank", "nnodes", ...), or nullopt.
// `max_nodes`: the job's node count (or range's maximum) as resolved so far.
std::optional<KubernetesValue> kubernetes_fallback(const std::string& name,
                                                   const KubernetesEnv& env, int64_t max_nodes);

// A pod of a PyTorchJob whose operator predates Training Operator 1.7: Kubernetes' own
// KUBERNETES_SERVICE_HOST (every pod has it) with MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK,
// and neither PET_NNODES (which 1.7 added, and after which WORLD_SIZE counts processes, not
// pods) nor what a launcher gives its workers (LOCAL_RANK, TORCHELASTIC_RUN_ID): a dlaunch run
// by a worker must not take its worker's ranks for node ranks.
bool is_legacy_pytorchjob_pod(const KubernetesEnv& env);

}  // namespace dlaunch
