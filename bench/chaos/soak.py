#!/usr/bin/python3
"""Chaos soak: an elastic dtrain job on --nodes hosts (4 by default), faults injected by a seeded
schedule, and a check after each fault that the job recovered, then at the end that it finished,
trained as well as a fault-free run and left nothing behind (docs/benchmarks.md, "Chaos soak").

  /usr/bin/python3 bench/chaos/soak.py --build build --duration 600 --seed 1 [--hosts netns]

How a failed worker is recovered: `--restart_scope rank` (dlaunch's default) replaces only the
failed rank while the others keep running (dtrain opts in), `group` restarts the whole worker
group; `both` runs the faulted soak once with each, on the same seed and fault schedule, and
prints their goodput side by side.

Hosts: `netns` puts each agent in its own network namespace on one bridge (10.78.0.1-4; needs
root and iproute2), which makes a link cut possible; `local` (the default when namespaces are
unavailable) runs 4 agents on 127.0.0.1. Agent 0 hosts the store (c10d backend) and is never
faulted: with the c10d backend the store host is the job's single point of failure
(docs/rendezvous.md); with `--backend etcd` it is not, and agent 0 is faulted like the others.

Faults, one at a time, each chosen by the seeded generator among --faults, after a random gap:
  worker_kill   SIGKILL of one dtrain worker (its agent restarts the group)
  worker_stop   SIGSTOP of one worker: a hang, found by --hang_timeout through the heartbeat
  agent_kill    SIGKILL of an agent (node loss; its workers die with it, its orphan guard
                cleans up); the others re-form without it,
                and the node comes back (a new agent) once they have: a scale-up
  link_cut      (netns only) the host's link down for --cut_seconds, then up; its agent is
                restarted if it gave up
and, once --duration has passed, job_term: SIGTERM to every agent (a preemption), then all four
started again; dtrain resumes from its checkpoint and trains to the end.

Goodput, the figure users of large jobs track, is useful training time / wall time over the
faulted run: from rank 0's step lines (each stamped with its time and worker-group attempt), the
distinct steps made times the run's own undisturbed pace per step (the median interval between
consecutive steps of one attempt), over the wall time from the first line to the last; so a
step redone, a restart's or replacement's gap and slow steps after it are all lost time. Printed
with the steps redone in all (docs/benchmarks.md, "Goodput under faults").

A fault is recovered when rank 0 logs a training step it had not logged before the fault (the
job's metrics.jsonl, one line per step): recovery time is fault -> that line, steps lost is the
last step before the fault minus the step it resumed from. The run passes when every fault
recovered within --recovery_timeout, the job exited 0, its final test accuracy is within
--accuracy_tolerance of a fault-free run with the same seed (--reference, on by default), and
no process, /dev/shm segment or listening port of the job is left.
"""
import argparse
import fcntl
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

BRIDGE = "dl_soak_br"
NS_PREFIX = "dl_soak"


def hang_timeout_arg(text):
    """dlaunch's --hang_timeout: seconds, or auto / auto:STARTUP (passed as given)."""
    if text == "auto" or text.startswith("auto:"):
        return text
    return "%g" % float(text)


def log(msg):
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(cmd, check=True):
    r = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{cmd}: {r.stdout.strip()}")
    return r.returncode


class Network:
    """The hosts: addresses, how to run a command on one, how to cut its link."""

    def __init__(self, mode, hosts):
        self.mode, self.hosts = mode, hosts

    def address(self, i):
        return f"10.78.0.{i + 1}" if self.mode == "netns" else "127.0.0.1"

    def prefix(self, i):
        return ["ip", "netns", "exec", f"{NS_PREFIX}{i}"] if self.mode == "netns" else []

    def setup(self):
        if self.mode != "netns":
            return
        self.hold_names()
        self.teardown()
        sh(f"ip link add {BRIDGE} type bridge && ip link set {BRIDGE} up")
        for i in range(self.hosts):
            ns = f"{NS_PREFIX}{i}"
            sh(f"ip netns add {ns}")
            sh(f"ip link add {ns}h type veth peer name {ns}b")
            sh(f"ip link set {ns}h netns {ns} && ip link set {ns}b master {BRIDGE} && ip link set {ns}b up")
            sh(f"ip -n {ns} addr add {self.address(i)}/24 dev {ns}h")
            sh(f"ip -n {ns} link set {ns}h up && ip -n {ns} link set lo up")

    def hold_names(self):
        """One soak at a time owns the bridge and the namespaces: a second one's setup would tear
        down the first's network under its running job (its store stops answering)."""
        self.lock = open(f"/run/lock/{BRIDGE}.lock", "a+")
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.lock.seek(0)
            holder = self.lock.read().strip() or "another process"
            raise SystemExit(f"soak.py: another soak ({holder}) holds the network namespaces "
                             f"{NS_PREFIX}* and the bridge {BRIDGE}; wait for it to end "
                             f"(or use --hosts local)")
        self.lock.truncate(0)
        self.lock.write(f"pid {os.getpid()}")
        self.lock.flush()

    def teardown(self):
        if self.mode != "netns":
            return
        for i in range(self.hosts):
            sh(f"ip netns del {NS_PREFIX}{i}", check=False)
            sh(f"ip link del {NS_PREFIX}{i}b", check=False)
        sh(f"ip link del {BRIDGE}", check=False)

    def set_link(self, i, up):
        sh(f"ip link set {NS_PREFIX}{i}b {'up' if up else 'down'}")

    @staticmethod
    def available():
        if os.geteuid() != 0 or shutil.which("ip") is None:
            return False
        probe = f"{NS_PREFIX}_probe{os.getpid()}"
        if sh(f"ip netns add {probe}", check=False) != 0:
            return False
        sh(f"ip netns del {probe}", check=False)
        return True


def children(pid):
    """Every descendant of pid (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(x) for x in f.read().split()]
                out += kids
                todo += kids
        except OSError:
            pass
    return out


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def exe_name(pid):
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return ""


def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = [kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv]
        return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
    except OSError:
        return {}


def parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def process_state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


class Job:
    """The 4 agents of one elastic dtrain job, started and restarted by the soak."""

    def __init__(self, args, net, workdir, port, run_id, extra_dtrain=(), scope="rank"):
        self.args, self.net, self.workdir, self.port, self.run_id = args, net, workdir, port, run_id
        self.scope = scope
        self.extra_dtrain = list(extra_dtrain)
        os.makedirs(workdir, exist_ok=True)
        self.out = os.path.join(workdir, "out")
        self.agents = {}  # host index -> Popen
        self.log_dirs = {}  # host index -> --log_dir of its current agent
        self.exit_codes = {}
        self.pids_seen = set()
        self.starts = 0

    def endpoint(self):
        if self.args.backend == "etcd":
            return self.args.etcd_endpoint
        return f"{self.net.address(0)}:{self.port}"

    def dtrain_args(self):
        a = [os.path.join(self.args.build, "bin", "dtrain"), "--dataset", "synthetic",
             "--epochs", str(self.args.epochs), "--width", str(self.args.width),
             "--batch_size", str(self.args.batch_size), "--log_every", "1", "--eval_every", "0",
             "--threads", "1", "--seed", str(self.args.seed), "--output_dir", self.out]
        return a + self.args.dtrain_extra.split() + self.extra_dtrain

    def agent_argv(self, i):
        d = os.path.join(self.args.build, "bin", "dlaunch")
        conf = (f"keep_alive_interval={self.args.keep_alive},keep_alive_max_attempt=3,"
                f"join_timeout=120,last_call_timeout=1")
        return self.net.prefix(i) + [
            d, "--nnodes", f"{self.args.min_nodes}:{self.net.hosts}",
            "--nproc_per_node", str(self.args.nproc_per_node),
            "--restart_scope", self.scope,
            "--rdzv_backend", self.args.backend, "--rdzv_endpoint", self.endpoint(),
            "--rdzv_id", self.run_id, "--rdzv_conf", conf, "--max_restarts", "1000",
            "--hang_timeout", self.args.hang_timeout,
            "--local_addr", self.net.address(i),
            "--log_dir", self.log_dirs[i],
        ] + self.dtrain_args()

    def start(self, i):
        self.starts += 1
        self.log_dirs[i] = os.path.join(self.workdir, "logs", f"host{i}_{self.starts}")
        log_path = os.path.join(self.workdir, f"agent{i}.log")
        f = open(log_path, "ab")
        f.write(f"\n===== start {self.starts} at {time.strftime('%H:%M:%S')} =====\n".encode())
        f.flush()
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.agents[i] = subprocess.Popen(self.agent_argv(i), stdout=f, stderr=subprocess.STDOUT, env=env)
        f.close()
        self.exit_codes.pop(i, None)

    def start_all(self):
        self.start(0)
        deadline = time.time() + 30
        if self.args.backend == "c10d":  # the store host first, so it is the one that binds
            while not port_listening(self.port, self.net.prefix(0)) and time.time() < deadline:
                time.sleep(0.05)
        for i in range(1, self.net.hosts):
            self.start(i)

    def poll(self):
        """Records exits and every pid that belongs to the job (for the leftover check)."""
        for i, p in list(self.agents.items()):
            rc = p.poll()
            if rc is not None:
                self.exit_codes[i] = rc
                del self.agents[i]
            else:
                self.pids_seen.add(p.pid)
                self.pids_seen.update(children(p.pid))

    def workers(self, i):
        p = self.agents.get(i)
        if p is None:
            return []
        # By executable, not argv: the agent's own forks (its orphan guard) carry the agent's
        # argv, which names dtrain too.
        return [c for c in children(p.pid) if exe_name(c) == "dtrain" and process_state(c) not in ("Z", "gone")]

    def newest_attempt(self, i):
        """The agent's newest attempt: its highest <log_dir>/<run_id>/attempt_<n> (made before
        that attempt's workers start), or None before the first."""
        root, found = self.log_dirs.get(i), []
        try:
            for run in os.listdir(root):
                for d in os.listdir(os.path.join(root, run)):
                    if d.startswith("attempt_") and d[8:].isdigit():
                        found.append(int(d[8:]))
        except (OSError, TypeError):
            pass
        return max(found) if found else None

    def training_group(self):
        """{host: worker pids} of the worker group training now, each checked in /proc: a dtrain
        started by the agent itself (not a grandchild, not the agent's own fork), running or
        sleeping (not stopped, not dying), of the agent's newest attempt (DLAUNCH_ATTEMPT), and
        all of one group: every live agent has workers and their WORLD_SIZE is the number of
        them. None while the job is between groups (a group being torn down or replaced, an
        agent still joining): a fault aimed then may hit a process that no longer trains."""
        group = {}
        for i, p in self.agents.items():
            ws = [w for w in self.workers(i) if exe_name(parent(w)) == "dlaunch"]
            attempt = self.newest_attempt(i)
            if not ws or attempt is None:
                return None
            for w in ws:
                env = environ(w)
                if process_state(w) not in ("R", "S", "D") or env.get("DLAUNCH_ATTEMPT") != str(attempt):
                    return None
            group[i] = sorted(ws)
        n = sum(len(ws) for ws in group.values())
        if {environ(w).get("WORLD_SIZE") for ws in group.values() for w in ws} != {str(n)}:
            return None
        return group

    def settled_group(self, progress, timeout=5.0):
        """training_group(), confirmed by rank 0 logging a step while it stayed the same; None
        when it does not within `timeout`."""
        before, step = self.training_group(), progress.last_step()
        deadline = time.time() + timeout
        while before and time.time() < deadline:
            if progress.last_step() > step:
                return before if self.training_group() == before else None
            time.sleep(0.05)
        return None

    def all_workers(self):
        return {w for i in self.agents for w in self.workers(i)}

    SHRINK_LINE = "the group re-forms in process at world size"

    def shrinks(self):
        """How many in-process shrinks each live agent has logged (a lost node's survivors
        re-formed without new workers: the agent's line, docs/env.md), by host."""
        counts = {}
        for i in self.agents:
            try:
                with open(os.path.join(self.workdir, f"agent{i}.log"), errors="replace") as f:
                    counts[i] = f.read().count(self.SHRINK_LINE)
            except OSError:
                counts[i] = 0
        return counts

    def regrouped(self, old_workers, faulted=None, shrinks_before=None):
        """True once every live agent runs its full complement of workers and either none of
        them predates the fault (a whole-group restart, a re-formed job), or the faulted worker
        is gone and a new one runs beside the survivors (a rank replaced in place), or every
        live agent logged an in-process shrink since the fault (a lost node: the survivors keep
        their processes). A step logged after this needs every rank of the group, so it is the
        new group's."""
        if not self.agents:
            return False
        current = [self.workers(i) for i in self.agents]
        if any(len(ws) < self.args.nproc_per_node for ws in current):
            return False
        everyone = [w for ws in current for w in ws]
        if not any(w in old_workers for w in everyone):
            return True
        if shrinks_before is not None:
            now = self.shrinks()
            if all(now[i] > shrinks_before.get(i, 0) for i in now):
                return True
        return (faulted is not None and faulted not in everyone and
                any(w not in old_workers for w in everyone))

    def finished(self):
        """Training ran to its end: every agent exited, all with 0."""
        self.poll()
        return not self.agents and bool(self.exit_codes) and all(rc == 0 for rc in self.exit_codes.values())

    def alive(self):
        self.poll()
        return sorted(self.agents)


def port_listening(port, ns_prefix=()):
    """Whether something listens on TCP `port`, in the network namespace `ns_prefix` enters
    (ip netns exec ...) or in ours."""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            if ns_prefix:
                text = subprocess.run(list(ns_prefix) + ["cat", name], stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True).stdout
            else:
                with open(name) as f:
                    text = f.read()
        except OSError:
            continue
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) > 3 and int(parts[1].rsplit(":", 1)[1], 16) == port and parts[3] == "0A":
                return True
    return False


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Progress:
    """Rank 0's step lines in metrics.jsonl, read as they are appended."""

    def __init__(self, path):
        self.path, self.offset, self.steps = path, 0, []  # (wall time seen, step, loss)

    def read(self):
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind("\n") + 1
        self.offset += len(data[:end].encode())
        now = time.time()
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("kind") == "step":
                self.steps.append((now, rec["step"], rec["loss"]))

    def last_step(self):
        self.read()
        return self.steps[-1][1] if self.steps else 0

    def first_after(self, t):
        self.read()
        for seen, step, _ in self.steps:
            if seen > t:
                return seen, step
        return None


def wait_recovery(job, progress, fault_time, old_workers, timeout, rejoin=None, faulted=None,
                  shrinks_before=None):
    """Seconds from the fault to the first step logged by the new worker group, and that step;
    None on timeout. A step line counts only once the group re-formed (Job.regrouped: new
    workers everywhere, a replaced rank, or every live agent's in-process shrink since
    `shrinks_before`; a line the old group wrote late is not a recovery). rejoin() restarts
    agents that exited meanwhile (node loss, link cut)."""
    deadline = fault_time + timeout
    regrouped_at = None
    while time.time() < deadline:
        job.poll()
        if rejoin:
            rejoin()
        if regrouped_at is None:
            progress.read()  # lines of the old group are consumed before the new group starts
            if job.regrouped(old_workers, faulted, shrinks_before):
                regrouped_at = time.time()
        else:
            got = progress.first_after(regrouped_at)
            if got:
                return got[0] - fault_time, got[1]
        if job.finished():
            return "finished"
        if not job.agents:
            return None
        time.sleep(0.05)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--duration", type=float, default=600, help="seconds of faults before job_term")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hosts", choices=["auto", "netns", "local"], default="auto")
    ap.add_argument("--nodes", type=int, default=4, help="hosts, one agent each")
    ap.add_argument("--min_nodes", type=int, default=2, help="the job's --nnodes MIN (MAX is --nodes)")
    ap.add_argument("--nproc_per_node", type=int, default=1)
    ap.add_argument("--restart_scope", choices=["rank", "group", "both"], default="rank",
                    help="dlaunch's --restart_scope; both: one faulted run with each, same seed")
    ap.add_argument("--backend", choices=["c10d", "etcd"], default="c10d")
    ap.add_argument("--etcd_endpoint", default="127.0.0.1:2379")
    ap.add_argument("--faults", default="worker_kill,worker_stop,agent_kill,link_cut")
    ap.add_argument("--gap", type=float, default=8.0, help="mean seconds between a recovery and the next fault")
    ap.add_argument("--epochs", type=int, default=0, help="0: as many as a fault-free run fits in --fill x --duration")
    ap.add_argument("--fill", type=float, default=1.0, help="with --epochs 0: the share of --duration to size for")
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--hang_timeout", type=hang_timeout_arg, default="6",
                    help="seconds, or auto / auto:STARTUP (learned from the workers' pace)")
    ap.add_argument("--keep_alive", type=float, default=1)
    ap.add_argument("--cut_seconds", type=float, default=6)
    ap.add_argument("--recovery_timeout", type=float, default=90)
    ap.add_argument("--accuracy_tolerance", type=float, default=0.05)
    ap.add_argument("--no_reference", action="store_true", help="skip the fault-free run")
    ap.add_argument("--dtrain_extra", default="", help="more dtrain flags, e.g. '--flash_every 10'")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)

    mode = args.hosts
    if mode == "auto":
        mode = "netns" if Network.available() else "local"
    kinds = [k for k in args.faults.split(",") if k]
    if mode == "local" and "link_cut" in kinds:
        kinds.remove("link_cut")
        log("local hosts: no link_cut (needs --hosts netns)")
    net = Network(mode, args.nodes)
    workdir = tempfile.mkdtemp(prefix="dlaunch_soak_")
    scopes = ["group", "rank"] if args.restart_scope == "both" else [args.restart_scope]
    results = []
    net.setup()
    try:
        reference = None
        if args.epochs == 0:
            size_epochs(args, net, workdir)
        if not args.no_reference:
            acc, ref_secs = reference_run(args, net, workdir)
            reference = {"test_accuracy": acc, "seconds": ref_secs, "epochs": args.epochs}
        for scope in scopes:
            summary, problems = soak_once(args, net, workdir, scope, kinds, reference)
            print_summary(summary, problems)
            results.append((summary, problems))
    finally:
        net.teardown()
    if len(results) > 1:
        print_comparison(results)
    problems = [p for _, ps in results for p in ps]
    if not args.keep and not problems:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        for summary, _ in results:
            with open(os.path.join(workdir, f"summary_{summary['restart_scope']}.json"), "w") as f:
                json.dump(summary, f, indent=1)
        log(f"work directory kept: {workdir} (summary_*.json, agent logs)")
    return 1 if problems else 0


def soak_once(args, net, workdir, scope, kinds, reference):
    """One faulted run with dlaunch's --restart_scope `scope`: (summary, problems). The fault
    schedule depends on the seed alone, so two scopes meet the same faults in the same order
    (the gaps run from each recovery, so not at the same wall times)."""
    rng = random.Random(args.seed)
    shm_before = set(os.listdir("/dev/shm"))
    summary = {"hosts": net.mode, "backend": args.backend, "seed": args.seed, "faults": [],
               "restart_scope": scope, "nodes": net.hosts, "nproc_per_node": args.nproc_per_node}
    if reference:
        summary["reference"] = reference
    reference_acc = reference["test_accuracy"] if reference else None
    problems = []
    port = free_port()
    job = Job(args, net, os.path.join(workdir, f"soak_{scope}"), port, f"soak{args.seed}{scope}",
              scope=scope)
    progress = Progress(os.path.join(job.out, "metrics.jsonl"))
    log(f"soak ({scope}): {net.mode} hosts x {args.nproc_per_node} workers, {args.backend}, "
        f"epochs {args.epochs}, faults {kinds}, seed {args.seed}, dir {job.workdir}")
    job.start_all()
    t0 = time.time()
    while progress.last_step() < 3:  # training under way before the first fault
        if not job.alive():
            raise RuntimeError(f"the job ended before training started; see {job.workdir}/agent*.log")
        time.sleep(0.2)

    def rejoin():  # an agent that gave up (e.g. after a link cut) comes back
        for h in range(net.hosts):
            if h not in job.agents and job.agents:
                job.start(h)

    while time.time() - t0 < args.duration and job.alive():
        time.sleep(rng.expovariate(1.0 / args.gap))
        step_before, old_workers, shrinks_before = progress.last_step(), job.all_workers(), job.shrinks()
        fault = inject(rng.choice(kinds), job, net, args, rng, progress)
        if fault is None:
            continue
        fault["step_before"] = step_before
        got = wait_recovery(job, progress, fault["time"], old_workers, args.recovery_timeout,
                            rejoin=fault.get("rejoin", rejoin), faulted=fault.get("pid"),
                            shrinks_before=shrinks_before)
        finish_fault(fault, got, summary, problems)
        if fault["kind"] == "agent_kill" and got != "finished":  # the node returns: a scale-up, timed as its own event
            rejoin_event = {"kind": "node_rejoin", "time": time.time(), "host": fault["host"]}
            rejoin_event["step_before"], old_workers = progress.last_step(), job.all_workers()
            job.start(fault["host"])
            got = wait_recovery(job, progress, rejoin_event["time"], old_workers,
                                args.recovery_timeout, rejoin)
            finish_fault(rejoin_event, got, summary, problems)
    if job.finished():
        log(f"the job finished its {args.epochs} epochs within --duration: no job_term (use more epochs)")
    else:
        job_term(job, progress, args, summary, problems)
    deadline = time.time() + args.duration * 4 + 600
    while job.alive() and time.time() < deadline:
        time.sleep(0.5)
    if job.agents:
        problems.append("the job did not finish after the last fault")
        for p in job.agents.values():
            p.kill()
    codes = dict(job.exit_codes)
    summary["final_exit_codes"] = codes
    if any(rc != 0 for rc in codes.values()):
        problems.append(f"the job did not exit 0 everywhere: {codes}")
    acc = final_accuracy(job.out)
    summary["test_accuracy"] = acc
    summary["goodput"] = goodput(read_steps(job.out), since=t0)
    if acc is None:
        problems.append("no final test accuracy in metrics.jsonl")
    elif reference_acc is not None and abs(acc - reference_acc) > args.accuracy_tolerance:
        problems.append(f"final test accuracy {acc:.4f} vs fault-free {reference_acc:.4f}: "
                        f"more than {args.accuracy_tolerance} apart")
    problems += leftovers(job, shm_before)
    return summary, problems


def print_comparison(results):
    """The scopes side by side: goodput, recovery and steps lost per fault kind."""
    print("\n== restart scopes compared (same seed, same fault schedule) ==")
    print(f"{'scope':<6} {'goodput':>8} {'redone':>7} {'faults':>7} {'recovery med s':>15} "
          f"{'steps lost med':>15} {'test acc':>9}")
    for summary, _ in results:
        g = summary.get("goodput") or {}
        rec = [f for f in summary["faults"] if f.get("recovered")]
        med = statistics.median([f["recovery_s"] for f in rec]) if rec else float("nan")
        lost = statistics.median([f["steps_lost"] for f in rec]) if rec else float("nan")
        acc = summary.get("test_accuracy")
        print(f"{summary['restart_scope']:<6} {g.get('goodput') or float('nan'):>8.4f} "
              f"{g.get('steps_redone', '-'):>7} {len(summary['faults']):>7} {med:>15.2f} "
              f"{lost:>15.0f} {acc if acc is not None else float('nan'):>9.4f}")


def job_term(job, progress, args, summary, problems):
    """The end of the soak: SIGTERM to every agent (a preemption), then all started again."""
    term = {"kind": "job_term", "step_before": progress.last_step()}
    old_workers = job.all_workers()
    for p in job.agents.values():
        p.send_signal(signal.SIGTERM)
    deadline = time.time() + 60
    while job.alive() and time.time() < deadline:
        time.sleep(0.1)
    if job.agents:
        problems.append(f"job_term: agents on hosts {sorted(job.agents)} still running 60 s after SIGTERM")
        for p in job.agents.values():
            p.kill()
        job.poll()
    term["exit_codes"] = dict(job.exit_codes)
    term["time"] = time.time()  # recovery counts from the restart
    job.start_all()
    got = wait_recovery(job, progress, term["time"], old_workers, args.recovery_timeout)
    finish_fault(term, got, summary, problems)


def inject(kind, job, net, args, rng, progress):
    """Injects one fault; returns its record, or None when nothing could take it now."""
    hosts = job.alive()
    faultable = [h for h in hosts if h != 0 or args.backend == "etcd"]
    if not faultable:
        return None
    h = rng.choice(faultable)
    fault = {"kind": kind, "host": h}
    if kind in ("worker_kill", "worker_stop"):
        # A worker of the group training now, never one of a group being replaced: stopping
        # that (an earlier soak did, twice) lets training go on and counts a recovery that
        # never was.
        group = job.settled_group(progress)
        if group is None or h not in group:
            log(f"no {kind} now: the job is between worker groups")
            return None
        pid = rng.choice(group[h])
        fault["time"] = time.time()
        os.kill(pid, signal.SIGKILL if kind == "worker_kill" else signal.SIGSTOP)
        fault["pid"] = pid
    elif kind == "agent_kill":
        if len(hosts) <= args.min_nodes:  # one more loss would end the job, not test recovery
            return None
        # The agent alone, as the OOM killer or a crash would: its workers die with it
        # (PDEATHSIG) and its orphan guard cleans up (process groups, flash directory). Killing
        # the guard as well (a kill -9 of the whole tree) leaves the flash tmpfs mounted until
        # the next dlaunch sweeps it, which the leftover check would count against the job.
        fault["time"] = time.time()
        job.agents[h].send_signal(signal.SIGKILL)
        fault["rejoin"] = lambda: None  # the node stays away until the others re-formed
    elif kind == "link_cut":
        if len(hosts) <= args.min_nodes:
            return None
        fault["time"] = time.time()
        net.set_link(h, False)
        restore_at = fault["time"] + args.cut_seconds

        def rejoin_after_cut():
            if time.time() >= restore_at and not fault.get("restored"):
                net.set_link(h, True)
                fault["restored"] = True
            if fault.get("restored"):
                for other in range(net.hosts):
                    if other not in job.agents and job.agents:
                        job.start(other)
        fault["rejoin"] = rejoin_after_cut
    log(f"fault {kind} on host {h}")
    return fault


def finish_fault(fault, got, summary, problems):
    fault.pop("rejoin", None)
    if got == "finished":  # the job trained to its end meanwhile: nothing left to recover
        fault["recovered"] = None
        log(f"  the job finished before {fault['kind']} needed a recovery")
        summary["faults"].append(fault_record(fault))
        return
    if got is None:
        fault["recovered"] = False
        problems.append(f"{fault['kind']} on host {fault.get('host')} at step {fault['step_before']}: "
                        "no training step logged within the recovery timeout")
    else:
        secs, step = got
        fault.update(recovered=True, recovery_s=round(secs, 3), resumed_step=step,
                     steps_lost=max(0, fault["step_before"] - (step - 1)))
        log(f"  recovered in {secs:.2f} s at step {step} (last before: {fault['step_before']}, "
            f"lost {fault['steps_lost']})")
    summary["faults"].append(fault_record(fault))


def fault_record(fault):
    """The fault as summary_*.json keeps it: its wall time as `at` (Unix seconds, for lining it up
    with the logs' stamps: bench/chaos/recovery_breakdown.py)."""
    rec = {k: v for k, v in fault.items() if k != "time"}
    if "time" in fault:
        rec["at"] = round(fault["time"], 3)
    return rec


def read_steps(out):
    """Rank 0's step lines as (time, attempt, step), in the order written."""
    steps = []
    try:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("kind") == "step":
                    steps.append((rec["time"], rec.get("attempt", 0), rec["step"]))
    except OSError:
        pass
    return steps


def goodput(steps, since=None):
    """Useful training time / wall time over `steps` (read_steps) from `since` (default: the
    first line) to the last line, and the number of step lines later redone. Useful time is the
    progress made (distinct steps) at the run's own undisturbed pace (the median interval between
    consecutive steps of one attempt): a redone step, the gap of a restart or a replacement, and
    slow steps after one (a new process warming up) all count as lost, whichever path recovered.
    Counting the intervals themselves instead would call a replacement's gap useful, as the
    interrupted step ends in it."""
    if since is not None:
        steps = [s for s in steps if s[0] >= since]
    if len(steps) < 2:
        return None
    last_line_of = {}
    for i, (_, _, step) in enumerate(steps):
        last_line_of[step] = i
    paces = [t1 - t0 for (t0, a0, s0), (t1, a1, s1) in zip(steps, steps[1:]) if a1 == a0 and s1 == s0 + 1]
    wall = steps[-1][0] - steps[0][0]
    if not paces or wall <= 0:
        return None
    pace = statistics.median(paces)
    useful = min(wall, (len(last_line_of) - 1) * pace)
    redone = len(steps) - len(last_line_of)
    return {"goodput": round(useful / wall, 4), "useful_s": round(useful, 2),
            "wall_s": round(wall, 2), "steps_redone": redone, "step_s": round(pace, 4)}


def final_accuracy(out):
    acc = None
    try:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("kind") == "epoch" and "test_accuracy" in rec:
                    acc = rec["test_accuracy"]
    except (OSError, ValueError):
        return None
    return acc


def run_to_end(job, progress=None):
    t = time.time()
    job.start_all()
    while job.alive():
        if progress:
            progress.read()
        time.sleep(0.05)
    if any(rc != 0 for rc in job.exit_codes.values()):
        raise RuntimeError(f"the fault-free run failed: {job.exit_codes}; see {job.workdir}/agent*.log")
    return time.time() - t


def size_epochs(args, net, workdir):
    """--epochs 0: a 60-step run times steps 20 to 60 (start-up excluded) to say how many epochs
    fill --fill x --duration without faults (faults slow the job: below 1, it ends near
    --duration rather than training on long after the final SIGTERM)."""
    args.epochs = 1000
    probe = Job(args, net, os.path.join(workdir, "probe"), free_port(), f"probe{args.seed}",
                ["--max_steps", "60"])
    seen = Progress(os.path.join(probe.out, "metrics.jsonl"))
    run_to_end(probe, seen)
    at = {step: t for t, step, _ in seen.steps}
    per_step = (at[60] - at[20]) / 40
    steps_per_epoch = 5000 // (args.batch_size * net.hosts * args.nproc_per_node)
    args.epochs = max(1, int(args.fill * args.duration / (per_step * steps_per_epoch)))
    log(f"{per_step:.3f} s per step without faults: {args.epochs} epochs")


def reference_run(args, net, workdir):
    """The same job with no faults: its accuracy and duration."""
    log(f"reference run (no faults): {args.epochs} epochs")
    job = Job(args, net, os.path.join(workdir, "reference"), free_port(), f"ref{args.seed}")
    secs = run_to_end(job)
    acc = final_accuracy(job.out)
    log(f"reference: test accuracy {acc}, {secs:.1f} s")
    return acc, round(secs, 1)


def leftovers(job, shm_before):
    found = []
    deadline = time.time() + 10
    while True:  # every agent and worker of the job has the job's directory in its argv
        live = [p for p in job.pids_seen
                if process_state(p) not in ("gone", "Z") and job.workdir in cmdline(p)]
        if not live or time.time() > deadline:
            break
        time.sleep(0.2)
    if live:
        found.append(f"processes of the job still running: {live}")
    pids = {str(p) for p in job.pids_seen}
    shm_new = [n for n in set(os.listdir("/dev/shm")) - shm_before
               if n.startswith("dlaunch") and (n.split("-")[2:3] and n.split("-")[2] in pids or job.run_id in n)]
    if shm_new:
        found.append(f"/dev/shm entries of the job left: {shm_new}")
    if job.args.backend == "c10d" and port_listening(job.port, job.net.prefix(0)):
        found.append(f"the job's store port {job.port} still listens")
    return found


def print_summary(summary, problems):
    faults = summary["faults"]
    print("\n== chaos soak summary ==")
    print(f"hosts {summary['hosts']} ({summary.get('nodes')} x {summary.get('nproc_per_node')} workers), "
          f"backend {summary['backend']}, seed {summary['seed']}, --restart_scope {summary.get('restart_scope')}")
    if "reference" in summary:
        r = summary["reference"]
        print(f"fault-free reference: {r['epochs']} epochs in {r['seconds']} s, test accuracy {r['test_accuracy']}")
    by_kind = {}
    for f in faults:
        by_kind.setdefault(f["kind"], []).append(f)
    print(f"{'fault':<12} {'n':>3} {'recovered':>9} {'median s':>9} {'worst s':>8} {'steps lost med/max':>19}")
    for kind, fs in sorted(by_kind.items()):
        rec = [f for f in fs if f["recovered"]]
        times = [f["recovery_s"] for f in rec] or [float("nan")]
        lost = [f["steps_lost"] for f in rec] or [0]
        print(f"{kind:<12} {len(fs):>3} {len(rec):>9} {statistics.median(times):>9.2f} {max(times):>8.2f} "
              f"{statistics.median(lost):>9.0f}/{max(lost):<9}")
    rec = [f for f in faults if f["recovered"]]
    if rec:
        t = [f["recovery_s"] for f in rec]
        print(f"all: {len(faults)} faults, {len(rec)} recovered, recovery median {statistics.median(t):.2f} s, "
              f"worst {max(t):.2f} s")
    g = summary.get("goodput")
    if g:
        print(f"goodput {g['goodput']:.4f} ({g['useful_s']} s of useful steps in {g['wall_s']} s), "
              f"{g['steps_redone']} step lines redone")
    print(f"final exit codes {summary.get('final_exit_codes')}, test accuracy {summary.get('test_accuracy')}")
    print("PASS" if not problems else "FAIL:\n  " + "\n  ".join(problems))


if __name__ == "__main__":
    sys.exit(main())
