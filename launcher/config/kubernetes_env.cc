#include "launcher/config/kubernetes_env.h"

#include <initializer_list>

namespace dlaunch {
namespace {

bool all_set(const KubernetesEnv& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (!env(name)) return false;
  }
  return true;
}

bool any_set(const KubernetesEnv& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (env(name)) return true;
  }
  return false;
}

std::optional<KubernetesValue> from(const KubernetesEnv& env, const char* variable,
                                    const char* meaning) {
  auto value = env(variable);
  if (!value) return std::nullopt;
  return KubernetesValue{*value, variable, std::string(variable) + " (" + meaning + ")"};
}

}  // namespace

bool is_legacy_pytorchjob_pod(const KubernetesEnv& env) {
  return all_set(env,
                 {"KUBERNETES_SERVICE_HOST", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}) &&
         !any_set(env, {"PET_NNODES", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"});
}

std::optional<KubernetesValue> kubernetes_fallback(const std::string& name,
                                                   const KubernetesEnv& env, int64_t max_nodes) {
  if (is_legacy_pytorchjob_pod(env)) {
    if (name == "nnodes") return from(env, "WORLD_SIZE", "PyTorchJob before 1.7: its pod count");
    if (name == "node_rank") return from(env, "RANK", "PyTorchJob before 1.7: this pod's index");
    if (name == "master_addr") return from(env, "MASTER_ADDR", "PyTorchJob before 1.7");
    if (name == "master_port") return from(env, "MASTER_PORT", "PyTorchJob before 1.7");
  }
  if (name == "node_rank" && max_nodes > 1) {
    return from(env, "JOB_COMPLETION_INDEX", "an indexed Job's pod index");
  }
  return std::nullopt;
}

}  // namespace dlaunch
