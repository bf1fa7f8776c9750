#!/usr/bin/python3
"""The manifests and the Dockerfile of examples/kubernetes/, checked for the fields dlaunch
relies on. No cluster runs here: this reads the YAML (Debian's python3-yaml), derives the
environment each controller would give the pods from it, by the controllers' rules
(docs/kubernetes.md), and has the built dlaunch --dry_run accept that environment.

    kubernetes_examples_test.py <repository root> <dlaunch binary>

Exit 77 (ctest: skipped) without python3-yaml."""
import os
import re
import subprocess
import sys
import unittest

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is missing (scripts/setup.sh --test installs it)")
    sys.exit(77)

ROOT = sys.argv[1] if len(sys.argv) > 1 else "."
DLAUNCH = sys.argv[2] if len(sys.argv) > 2 else "dlaunch"
EXAMPLES = os.path.join(ROOT, "examples", "kubernetes")
IMAGE = "registry.example.com/dlaunch:0.1.0"
# The names Trainer v2 reserves for its Torch plugin (pkg/constants/constants.go).
TRAINER_RESERVED = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                    "PET_MASTER_PORT"}


def load(name):
    with open(os.path.join(EXAMPLES, name)) as f:
        return {doc["kind"]: doc for doc in yaml.safe_load_all(f)}


def env_of(container):
    return {e["name"]: e["value"] for e in container.get("env", [])}


def dry_run(env):
    """dlaunch --dry_run with no flag in exactly `env` (plus what every pod has)."""
    pod_env = {"PATH": "/usr/bin:/bin", "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    pod_env.update(env)
    r = subprocess.run([DLAUNCH, "--dry_run"], env=pod_env, capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"dlaunch --dry_run exited {r.returncode} in {env}:\n{r.stderr}")
    return r.stdout


def setting(out, name):
    """(value, origin) of one --dry_run line: '  nnodes   = 2   <- PET_NNODES'."""
    m = re.search(rf"^  {name} +=(.*?)<- (.*)$", out, re.M)
    assert m, f"no {name} in:\n{out}"
    return m.group(1).strip(), m.group(2).strip()


class Commands:
    def assert_runs_dlaunch_without_flags(self, command):
        self.assertEqual(command[0], "dlaunch")
        for arg in command[1:]:
            self.assertFalse(arg.startswith("-"), f"{command}: the environment gives the flags")


class TrainJobTest(unittest.TestCase, Commands):
    def setUp(self):
        self.job = load("trainjob.yaml")["TrainJob"]

    def test_fields(self):
        self.assertEqual(self.job["apiVersion"], "trainer.kubeflow.org/v1alpha1")
        ref = self.job["spec"]["runtimeRef"]
        self.assertEqual(ref["name"], "torch-distributed")
        self.assertEqual(ref["kind"], "ClusterTrainingRuntime")
        trainer = self.job["spec"]["trainer"]
        self.assertEqual(trainer["image"], IMAGE)
        self.assert_runs_dlaunch_without_flags(trainer["command"])
        self.assertGreaterEqual(trainer["numNodes"], 2)
        self.assertIsInstance(trainer["numProcPerNode"], int)
        # Trainer refuses a TrainJob that sets the plugin's own variables.
        self.assertFalse(TRAINER_RESERVED & set(env_of(trainer)))

    def test_dlaunch_takes_the_plugins_environment(self):
        name = self.job["metadata"]["name"]
        trainer = self.job["spec"]["trainer"]
        # torch.go's EnforceMLPolicy; node 1 (node 0 would resolve its own name).
        env = dict(env_of(trainer), PET_NNODES=str(trainer["numNodes"]),
                   PET_NPROC_PER_NODE=str(trainer["numProcPerNode"]), PET_NODE_RANK="1",
                   PET_MASTER_ADDR=f"{name}-node-0-0.{name}", PET_MASTER_PORT="29500",
                   JOB_COMPLETION_INDEX="1")
        out = dry_run(env)
        self.assertEqual(setting(out, "nnodes"), (str(trainer["numNodes"]), "PET_NNODES"))
        self.assertEqual(setting(out, "node_rank"), ("1", "PET_NODE_RANK"))
        self.assertEqual(setting(out, "max_restarts"),
                         (env_of(trainer)["DLAUNCH_MAX_RESTARTS"], "DLAUNCH_MAX_RESTARTS"))


class PyTorchJobTest(unittest.TestCase, Commands):
    def setUp(self):
        self.job = load("pytorchjob-elastic.yaml")["PyTorchJob"]
        self.spec = self.job["spec"]

    def container(self):
        containers = self.spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
        return next(c for c in containers if c["name"] == "pytorch")

    def test_fields(self):
        self.assertEqual(self.job["apiVersion"], "kubeflow.org/v1")
        policy = self.spec["elasticPolicy"]
        self.assertLessEqual(policy["minReplicas"], policy["maxReplicas"])
        self.assertEqual(policy["rdzvBackend"], "c10d")
        # Elastic: workers only; their count within the range.
        self.assertEqual(set(self.spec["pytorchReplicaSpecs"]), {"Worker"})
        replicas = self.spec["pytorchReplicaSpecs"]["Worker"]["replicas"]
        self.assertTrue(policy["minReplicas"] <= replicas <= policy["maxReplicas"])
        # The operator reads the rendezvous port from this container and port name.
        c = self.container()
        self.assertEqual(c["image"], IMAGE)
        self.assert_runs_dlaunch_without_flags(c["command"])
        self.assertIn("pytorchjob-port", {p["name"] for p in c["ports"]})
        self.assertNotIn("nProcPerNode", policy)  # deprecated; spec.nprocPerNode instead

    def test_dlaunch_takes_the_operators_environment(self):
        policy = self.spec["elasticPolicy"]
        port = next(p["containerPort"] for p in self.container()["ports"]
                    if p["name"] == "pytorchjob-port")
        # envvar.go and elastic.go of Training Operator 1.9.
        env = dict(env_of(self.container()), PYTHONUNBUFFERED="1",
                   PET_NPROC_PER_NODE=self.spec["nprocPerNode"],
                   PET_RDZV_ENDPOINT=f"{self.job['metadata']['name']}-worker-0:{port}",
                   PET_RDZV_BACKEND=policy["rdzvBackend"],
                   PET_NNODES=f"{policy['minReplicas']}:{policy['maxReplicas']}",
                   PET_MAX_RESTARTS=str(policy["maxRestarts"]),
                   PET_RDZV_CONF=",".join(f"{kv['key']}={kv['value']}"
                                          for kv in policy["rdzvConf"]))
        out = dry_run(env)
        self.assertEqual(setting(out, "rdzv_backend"), ("c10d", "PET_RDZV_BACKEND"))
        self.assertEqual(setting(out, "nnodes"), (env["PET_NNODES"], "PET_NNODES"))
        self.assertEqual(setting(out, "rdzv_endpoint")[1], "PET_RDZV_ENDPOINT")
        self.assertEqual(setting(out, "rdzv_conf")[1], "PET_RDZV_CONF")


class IndexedJobTest(unittest.TestCase, Commands):
    def setUp(self):
        docs = load("indexed-job.yaml")
        self.service, self.job = docs["Service"], docs["Job"]
        self.pod = self.job["spec"]["template"]
        self.container = next(c for c in self.pod["spec"]["containers"])

    def test_service_is_headless_and_selects_the_pods(self):
        self.assertEqual(self.service["apiVersion"], "v1")
        self.assertEqual(self.service["spec"]["clusterIP"], "None")
        selector = self.service["spec"]["selector"]
        labels = self.pod["metadata"]["labels"]
        self.assertTrue(selector)
        self.assertEqual({k: labels.get(k) for k in selector}, selector)
        # Pod i is <job>-<i>.<service>.
        self.assertEqual(self.pod["spec"]["subdomain"], self.service["metadata"]["name"])

    def test_job_is_indexed_and_its_env_names_node_0(self):
        self.assertEqual(self.job["apiVersion"], "batch/v1")
        spec = self.job["spec"]
        self.assertEqual(spec["completionMode"], "Indexed")
        env = env_of(self.container)
        self.assertEqual(int(env["PET_NNODES"]), spec["completions"])
        self.assertEqual(spec["parallelism"], spec["completions"])
        job, service = self.job["metadata"]["name"], self.service["metadata"]["name"]
        self.assertEqual(env["PET_MASTER_ADDR"], f"{job}-0.{service}")
        port = int(env["PET_MASTER_PORT"])
        self.assertIn(port, {p["port"] for p in self.service["spec"]["ports"]})
        self.assertIn(port, {p["containerPort"] for p in self.container["ports"]})
        self.assertEqual(self.container["image"], IMAGE)
        self.assert_runs_dlaunch_without_flags(self.container["command"])
        # The node rank comes from Kubernetes, never from the manifest.
        self.assertNotIn("PET_NODE_RANK", env)

    def test_pod_failure_policy(self):
        policy = self.job["spec"]["podFailurePolicy"]
        self.assertEqual(self.pod["spec"]["restartPolicy"], "Never")
        names = {c["name"] for c in self.pod["spec"]["containers"]}
        actions = set()
        for rule in policy["rules"]:
            actions.add(rule["action"])
            if "onExitCodes" in rule:
                codes = rule["onExitCodes"]
                self.assertIn(codes["containerName"], names)
                self.assertNotIn(0, codes["values"])
            else:
                self.assertIn("DisruptionTarget", {c["type"] for c in rule["onPodConditions"]})
        self.assertEqual(actions, {"FailJob", "Ignore"})

    def test_dlaunch_takes_the_jobs_environment(self):
        env = dict(env_of(self.container), JOB_COMPLETION_INDEX="3")
        out = dry_run(env)
        self.assertEqual(setting(out, "node_rank"),
                         ("3", "JOB_COMPLETION_INDEX (an indexed Job's pod index)"))
        self.assertEqual(setting(out, "nnodes"), (env["PET_NNODES"], "PET_NNODES"))


class DockerfileTest(unittest.TestCase):
    def test_installs_the_package_and_runs_dlaunch(self):
        with open(os.path.join(EXAMPLES, "Dockerfile")) as f:
            lines = [l for l in f.read().splitlines() if l and not l.startswith("#")]
        text = "\n".join(lines)
        # The package is built on Debian 12 and depends on its libraries.
        self.assertRegex(lines[0], r"^FROM debian:bookworm")
        # CPack's file name: <name>_<version>_<arch>.deb (cmake/Package.cmake).
        with open(os.path.join(ROOT, "cmake", "Package.cmake")) as f:
            package = re.search(r"set\(CPACK_PACKAGE_NAME (\S+)\)", f.read()).group(1)
        self.assertIn(f"COPY {package}_*_amd64.deb /tmp/", text)
        self.assertRegex(text, rf"apt-get install -y --no-install-recommends /tmp/{package}_")
        self.assertIn('ENTRYPOINT ["dlaunch"]', text)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
