#!/usr/bin/python3
"""Chaos soak (issue 14): an elastic dtrain job on local agents, with seeded faults, checking
after each that the job recovered and at the end that nothing of it is left.

The job: --agents dlaunch agents on this host (127.0.0.1 .. 127.0.0.N as their addresses),
`--nnodes 2:N --rdzv_backend c10d`, one dtrain worker each, --hang_timeout, fast keep-alives.
The first agent binds the endpoint and hosts the store: it is never a victim (with the c10d
backend the store host is the job's single point of failure; see docs/rendezvous.md).

Every --interval seconds (+- 30%) the injector, seeded by --seed, picks one fault:
  worker_kill  SIGKILL one agent's worker: the agent restarts the group (the failure budget is
               large), dtrain resumes from the flash copy
  worker_hang  SIGSTOP one agent's worker: its heartbeat stops, --hang_timeout declares it hung,
               the group restarts
  node_loss    SIGKILL a non-store agent: its worker dies with it (PDEATHSIG), the orphan guard
               removes its flash directory, the others re-form without it; a replacement agent
               joins 2 s later (a scale-up back to N)
  store_loss   (only with --kinds store_loss) SIGKILL the agent hosting the c10d store: not
               survivable today; the soak reports how the other agents end, then stops
After each fault it waits (up to --recover_timeout) for a new worker generation and then for
the next step logged, and records: restart seen (s after the fault), next step logged (s after
the fault), steps lost (last step logged before the restart - first step after + 1).

At the end: SIGTERM to every agent (the job stops at a step, checkpoints, agents exit 143), then
checks that no process of the job, no flash directory (/dev/shm/dlaunch_flash_soak*), no new
/dev/shm entry and no listener on the endpoint is left. Prints one summary; exit 0 only when
every fault recovered and nothing was left.

  /usr/bin/python3 bench/chaos/soak.py --duration 300 --seed 1
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def step_lines(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                if j.get("kind") == "step":
                    out.append(j["step"])
    except FileNotFoundError:
        pass
    return out


def descendants(pid):
    children = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(p))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class Job:
    def __init__(self, args, work):
        self.args, self.work = args, work
        self.endpoint = f"127.0.0.1:{free_port()}"
        self.out = os.path.join(work, "out")
        self.agents = {}  # address -> (Popen, log path)
        self.spawned = 0

    def start_agent(self, k):
        addr = f"127.0.0.{k + 1}"
        self.spawned += 1
        log = os.path.join(self.work, f"agent{k}_{self.spawned}.log")
        cmd = [f"{self.args.build}/bin/dlaunch", f"--nnodes=2:{self.args.agents}",
               "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint={self.endpoint}",
               "--rdzv_id=soak", f"--local_addr={addr}",
               "--rdzv_conf=last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3",
               "--max_restarts=100000", f"--hang_timeout={self.args.hang_timeout}",
               "--shutdown_grace=3", f"--log_dir={self.work}/logs", f"{self.args.build}/bin/dtrain", "--width=8",
               "--batch_size=16", "--epochs=100000", "--log_every=1", "--eval_every=0",
               f"--flash_every={self.args.flash_every}", f"--output_dir={self.out}"]
        env = dict(os.environ, DTRAIN_LIMIT_TRAIN_SAMPLES="2000", DTRAIN_LIMIT_TEST_SAMPLES="100",
                   DLAUNCH_CONV_ALGO="direct", DLAUNCH_CONV_CACHE="off", OMP_NUM_THREADS="1")
        f = open(log, "w")
        self.agents[k] = (subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env), log)
        return self.agents[k]

    def logs_text(self):
        text = ""
        for p in sorted(os.listdir(self.work)):
            if p.endswith(".log"):
                with open(os.path.join(self.work, p), errors="replace") as f:
                    text += f.read()
        return text

    def worker_of(self, k):
        proc, _ = self.agents[k]
        for pid in descendants(proc.pid):
            # argv[0]: the agent's orphan guard (a copy of dlaunch) has dtrain among its arguments.
            if os.path.basename(cmdline(pid).split(" ")[0]) == "dtrain":
                return pid
        return None


def wait(pred, timeout, step=0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--duration", type=float, default=300, help="seconds of faults")
    p.add_argument("--interval", type=float, default=15, help="mean seconds between faults")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--hang_timeout", type=float, default=20)
    p.add_argument("--flash_every", type=int, default=5)
    p.add_argument("--recover_timeout", type=float, default=120)
    p.add_argument("--kinds", default="worker_kill,worker_hang,node_loss")
    args = p.parse_args()
    args.build = os.path.abspath(args.build)
    rng = random.Random(args.seed)
    kinds = args.kinds.split(",")
    shm_before = set(os.listdir("/dev/shm"))
    # Everything of the job (agents' run directories with --log_dir too) goes under one directory.
    work = tempfile.mkdtemp(prefix="chaos_soak_")
    job = Job(args, work)
    metrics = os.path.join(job.out, "metrics.jsonl")
    faults = []
    ok = True
    try:
        job.start_agent(0)
        if not wait(lambda: "hosting the job's store" in open(job.agents[0][1]).read(), 60):
            sys.exit("the first agent did not host the store:\n" + job.logs_text()[-3000:])
        for k in range(1, args.agents):
            job.start_agent(k)
        if not wait(lambda: len(step_lines(metrics)) >= 3, 300):
            sys.exit("the job did not start training:\n" + job.logs_text()[-3000:])
        end = time.time() + args.duration
        while time.time() < end:
            time.sleep(args.interval * rng.uniform(0.7, 1.3))
            kind = rng.choice(kinds)
            victim = rng.randrange(1 if kind == "node_loss" else 0, args.agents)
            generations = len(re.findall(r"attempt \d+: starting", job.logs_text()))
            t0 = time.time()
            if kind == "store_loss":
                # Not survivable with c10d (opt-in, to show what happens): the store host goes.
                job.agents[0][0].send_signal(signal.SIGKILL)
                for k, (proc, _) in job.agents.items():
                    try:
                        proc.wait(timeout=args.recover_timeout)
                    except subprocess.TimeoutExpired:
                        pass
                store_loss = {k: proc.poll() for k, (proc, _) in job.agents.items()}
                print(f"  store_loss: the store host (agent 0) SIGKILLed; the agents ended after "
                      f"{time.time() - t0:.1f} s with {store_loss}", flush=True)
                faults.append({"kind": kind, "victim": 0, "restart_s": None, "next_step_s": None,
                               "steps_lost": None, "recovered": False})
                ok = False
                break
            if kind in ("worker_kill", "worker_hang"):
                pid = job.worker_of(victim)
                if pid is None:
                    continue  # between generations: try another time
                os.kill(pid, signal.SIGKILL if kind == "worker_kill" else signal.SIGSTOP)
            else:
                proc, _ = job.agents[victim]
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            restart = wait(lambda: len(re.findall(r"attempt \d+: starting", job.logs_text())) > generations,
                           args.recover_timeout, 0.05)
            t_restart = time.time() - t0 if restart else None
            # Steps the old group still logged after the fault count as done: what the new group
            # redoes is measured from the last step logged before the restart.
            steps_before = step_lines(metrics)
            last_before = steps_before[-1] if steps_before else 0
            n = len(steps_before)
            if kind == "node_loss":
                time.sleep(2)
                job.start_agent(victim)
            resumed = wait(lambda: len(step_lines(metrics)) > n and step_lines(metrics)[n:], args.recover_timeout, 0.02)
            t_next = time.time() - t0 if resumed else None
            lost = last_before - (resumed[0] - 1) if resumed else None
            recovered = restart is not None and resumed is not None
            ok &= recovered
            faults.append({"kind": kind, "victim": victim, "restart_s": t_restart, "next_step_s": t_next,
                           "steps_lost": lost, "recovered": recovered})
            print(f"  {time.strftime('%H:%M:%S')} {kind} on agent {victim}: "
                  + (f"restart after {t_restart:.2f} s, next step after {t_next:.2f} s, {lost} steps lost"
                     if recovered else "NOT RECOVERED"), flush=True)
            if not recovered:
                break
    finally:
        # The end of the job: SIGTERM to every agent, as a scheduler's stop.
        codes = {}
        for k, (proc, _) in job.agents.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for k, (proc, _) in job.agents.items():
            try:
                codes[k] = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[k] = "did not stop within 60 s"
        time.sleep(1)
    leftovers = [f"process {pid}: {cmdline(pid)[:120]}" for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                 if work in cmdline(pid) and pid != os.getpid()]
    # Other jobs on the host come and go in /dev/shm: only this job's names count.
    shm_new = sorted(n for n in set(os.listdir("/dev/shm")) - shm_before if "soak" in n)
    host, port = job.endpoint.split(":")
    listening = socket.socket().connect_ex((host, int(port))) == 0
    by_kind = {}
    for f in faults:
        by_kind.setdefault(f["kind"], []).append(f)
    print(f"chaos soak: seed {args.seed}, {args.duration:.0f} s of faults, {args.agents} agents "
          f"(c10d, --nnodes 2:{args.agents}), dtrain width 8 --flash_every {args.flash_every}")
    for kind, fs in sorted(by_kind.items()):
        rec = [f for f in fs if f["recovered"]]
        nxt = [f["next_step_s"] for f in rec]
        print(f"  {kind}: {len(fs)} injected, {len(rec)} recovered"
              + (f"; next step after median {statistics.median(nxt):.2f} s, worst {max(nxt):.2f} s; "
                 f"steps lost median {statistics.median(f['steps_lost'] for f in rec):g}, worst "
                 f"{max(f['steps_lost'] for f in rec)}" if rec else ""))
    allrec = [f for f in faults if f["recovered"]]
    if allrec:
        nxt = [f["next_step_s"] for f in allrec]
        print(f"  all: {len(faults)} injected, {len(allrec)} recovered; median {statistics.median(nxt):.2f} s, "
              f"worst {max(nxt):.2f} s")
    print(f"  end: agents' exit codes {codes} (143: stopped by SIGTERM after the workers' checkpoint)")
    print(f"  leftovers: {len(leftovers)} processes, /dev/shm entries {shm_new or 'none'}, "
          f"endpoint {'still listening' if listening else 'closed'}")
    for l in leftovers:
        print("    " + l)
    clean = not leftovers and not shm_new and not listening
    if ok and clean:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"  logs kept in {work}")
    return 0 if ok and clean and faults else 1


if __name__ == "__main__":
    sys.exit(main())
