"""PyTorch workers' init time under dlaunch vs torchrun 1.13, 2 workers on one node, same run
(runs alternate). Each worker (torch_init_worker.py) prints CLOCK_MONOTONIC stamps; per run the
figure is the later of the two ranks (the job is initialised when both are):

  start->init        process start -> init_process_group("gloo") returned
  start->allreduce   process start -> first all_reduce returned
  import->init       `import torch` done -> init returned: the part the launcher's store
                     arrangement decides (the agent's store vs rank 0 hosting a TCPStore)
  launch->allreduce  the launcher spawned by this script -> first all_reduce returned

Usage (any python3 runs the driver; the workers use /usr/bin/python3, Debian's torch 1.13):
  python3 bench/agents/torch_init_bench.py --dlaunch build-x/bin/dlaunch [--runs 5]
"""
import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_init_worker.py")
PYTHON = "/usr/bin/python3"
FIELDS = ("start", "top", "imported", "init", "allreduce")
STAMPS = re.compile(r"init-times rank=(\d+) " + " ".join(f"{f}=(\\d+)" for f in FIELDS))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(argv):
    t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    t_end = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    # Searched in the whole text, not per line: torchrun runs workers with `python -u`, where
    # print() writes the text and the newline separately, so two ranks' lines can run together.
    ranks = {}
    for m in STAMPS.finditer(p.stdout):
        ranks[int(m.group(1))] = {k: int(v) for k, v in zip(FIELDS, m.groups()[1:])}
    if p.returncode != 0 or len(ranks) != 2:
        sys.stderr.write(f"run failed (exit {p.returncode}, {len(ranks)} ranks): {' '.join(argv)}\n"
                         f"{p.stdout[-2000:]}\n{p.stderr[-3000:]}\n")
        return None

    def latest(a, b):
        return max(r[b] - r[a] for r in ranks.values()) / 1e9

    return {
        "start->init": latest("start", "init"),
        "start->allreduce": latest("start", "allreduce"),
        "import->init": latest("imported", "init"),
        "launch->allreduce": max(r["allreduce"] - t0 for r in ranks.values()) / 1e9,
        "end to end": (t_end - t0) / 1e9,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dlaunch", required=True)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    dlaunch = [os.path.abspath(args.dlaunch), "--standalone", "--nproc_per_node", "2",
               "--python", PYTHON, WORKER]

    def torchrun():
        # Not --standalone: torch 1.13 then always uses port 29400, which other jobs on a shared
        # machine may hold; this is the same c10d single-node setup at a free port. -r 2 -t 2:
        # torchrun 1.13 on Python 3.11 crashes at argument parsing without -r and -t.
        return [PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
                "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}",
                "--rdzv_id", "init_bench", "-r", "2", "-t", "2", WORKER]

    print(f"load average at start: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    results = {"dlaunch": [], "torchrun": []}
    for i in range(args.runs):
        for name in ("dlaunch", "torchrun"):
            r = run_once(dlaunch if name == "dlaunch" else torchrun())
            if r:
                results[name].append(r)
                print(f"run {i} {name:8s} " + "  ".join(f"{k} {v:.3f}" for k, v in r.items()),
                      flush=True)
    print(f"load average at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    if not results["dlaunch"] or not results["torchrun"]:
        print("no successful runs on one side; no comparison")
        return 1
    print(f"\nmedians of {len(results['dlaunch'])} (dlaunch) and {len(results['torchrun'])} "
          f"(torchrun) runs, seconds:")
    print(f"{'figure':20s} {'dlaunch':>9s} {'torchrun':>9s} {'ratio':>7s}")
    for key in results["dlaunch"][0]:
        d = statistics.median(r[key] for r in results["dlaunch"])
        t = statistics.median(r[key] for r in results["torchrun"])
        print(f"{key:20s} {d:9.3f} {t:9.3f} {t / d:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
