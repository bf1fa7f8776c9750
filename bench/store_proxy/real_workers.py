"""Real PyTorch workers with and without the store proxy: NNODES dlaunch agents on this machine
(c10d rendezvous, one store host among them), each running NPROC PyTorch 2.15 workers of a small
gloo DDP training (tests/compat/store_proxy_ddp.py: fixed seeds, a few steps), once with
--store_proxy off and once on. Prints, per mode, what the store host's own statistics say (the
agent's /status, read by rank 0 while every worker is connected): connections open then, the
most open at once, accepted, channels opened by proxies, and the requests by op from the
workers and from the agents, per node; the wall time of init_process_group; and the training
result, which must be the same in both modes (exit 1 otherwise).

  python3 bench/store_proxy/real_workers.py [--dlaunch build/bin/dlaunch] [--nnodes 16]
      [--nproc_per_node 4] [--steps 5] [--python ~/.cache/dlaunch/venv-torch-2.15.0/bin/python]

First it measures one worker's anonymous memory (a 2-worker run): every worker process holds its
own copy (PyTorch 2.15's import alone is about 300 MiB of it; the libraries' pages are shared),
and when NNODES x NPROC of them would not fit in 85% of MemAvailable it says so, with the largest
--nnodes that fits, and exits 2 (--force runs anyway: the kernel's OOM killer then picks
processes, maybe not ours).

Any python3 runs the driver; the workers run --python. Run from the repository root after a
build.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(ROOT, "tests", "compat", "store_proxy_ddp.py")
DEFAULT_PYTHON = os.path.expanduser("~/.cache/dlaunch/venv-torch-2.15.0/bin/python")
MIB = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mem_available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run_job(args, nnodes, nproc, mode, workdir, label):
    """Runs one job of nnodes agents; returns (the worker's --output JSON, seconds from the
    first agent's start to the last agent's exit). Raises with the agents' logs on failure."""
    output = os.path.join(workdir, f"result_{label}.json")
    endpoint = f"127.0.0.1:{free_port()}"
    status_ports = [free_port() for _ in range(nnodes)]
    urls = ",".join(f"http://127.0.0.1:{p}/status" for p in status_ports)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    agents = []
    began = time.monotonic()
    for i, port in enumerate(status_ports):
        log = open(os.path.join(workdir, f"agent_{label}_{i}.log"), "w")
        argv = [args.dlaunch, f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
                "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}",
                f"--rdzv_id=real_workers_{label}", f"--status_port={port}",
                f"--store_proxy={mode}", f"--python={args.python}", WORKER,
                f"--status_url={urls}", f"--output={output}", f"--steps={args.steps}"]
        agents.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    failed = []
    for i, (proc, log) in enumerate(agents):
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "timeout"
        log.close()
        if code != 0:
            failed.append((i, code))
    took = time.monotonic() - began
    if failed or not os.path.exists(output):
        tails = []
        for i, code in failed[:3] or [(0, 0)]:
            with open(os.path.join(workdir, f"agent_{label}_{i}.log")) as f:
                tails.append(f"--- agent {i} (exit {code}):\n" + f.read()[-3000:])
        raise RuntimeError(f"--store_proxy {mode}: {len(failed)} agents failed {failed[:8]}, "
                           f"output {'present' if os.path.exists(output) else 'missing'}\n"
                           + "\n".join(tails))
    with open(output) as f:
        return json.load(f), took


def worker_memory(args, workdir):
    """The largest anonymous RSS of the workers of a 1-node, 2-worker run, in bytes."""
    result, _ = run_job(args, 1, 2, "off", workdir, "sizing")
    return max(result["rss_anon_bytes"])


def per_node(by_op, nnodes):
    total = sum(by_op.values())
    return total, total / nnodes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dlaunch", default=os.path.join(ROOT, "build", "bin", "dlaunch"))
    ap.add_argument("--python", default=DEFAULT_PYTHON)
    ap.add_argument("--nnodes", type=int, default=16)
    ap.add_argument("--nproc_per_node", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=900, help="per job, seconds")
    ap.add_argument("--force", action="store_true", help="run even if the workers may not fit")
    args = ap.parse_args()
    args.dlaunch = os.path.abspath(args.dlaunch)
    nnodes, nproc = args.nnodes, args.nproc_per_node
    for path, what in ((args.dlaunch, "--dlaunch"), (args.python, "--python")):
        if not os.access(path, os.X_OK):
            sys.stderr.write(f"{what} {path}: not an executable file; build dlaunch "
                             "(scripts/build.sh) or install PyTorch 2.15 (scripts/setup_torch2.sh)\n")
            return 2

    workdir = tempfile.mkdtemp(prefix="real_workers_")
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load average "
          f"{loadavg()}, {os.cpu_count()} CPUs, MemAvailable {mem_available_bytes() // MIB} MiB, "
          f"logs in {workdir}", flush=True)
    rss = worker_memory(args, workdir)
    budget = int(0.85 * mem_available_bytes())
    fits = budget // rss
    print(f"one worker's anonymous RSS: {rss // MIB} MiB; {fits} workers fit in 85% of "
          f"MemAvailable ({budget // MIB} MiB)", flush=True)
    if nnodes * nproc > fits and not args.force:
        sys.stderr.write(
            f"{nnodes} nodes x {nproc} workers = {nnodes * nproc} workers would need about "
            f"{nnodes * nproc * rss // MIB} MiB, more than the {budget // MIB} MiB available; "
            f"the largest that fits is --nnodes {max(1, fits // nproc)} --nproc_per_node {nproc} "
            "(or pass --force)\n")
        return 2

    results = {}
    for mode in ("off", "on"):
        result, took = run_job(args, nnodes, nproc, mode, workdir, mode)
        results[mode] = (result, took)
        print(f"--store_proxy {mode}: done in {took:.1f} s, load average {loadavg()}", flush=True)

    world = nnodes * nproc
    print(f"\n{nnodes} nodes x {nproc} workers (world {world}), gloo on CPU, {args.steps} steps, "
          f"PyTorch at {args.python}")
    rows = [
        ("store connections open (all workers up)", lambda r, s: s["connections"]),
        ("store connections, most at once", lambda r, s: s["connections_peak"]),
        ("store connections accepted", lambda r, s: s["connections_accepted"]),
        ("channels opened by store proxies", lambda r, s: s["channels_opened"]),
        ("workers' requests, total", lambda r, s: per_node(s["requests_by_op"]["workers"], nnodes)[0]),
        ("workers' requests per node", lambda r, s: f"{per_node(s['requests_by_op']['workers'], nnodes)[1]:.1f}"),
        ("agents' requests per node", lambda r, s: f"{per_node(s['requests_by_op']['agents'], nnodes)[1]:.1f}"),
        ("init_process_group, median rank (s)", lambda r, s: f"{statistics.median(r['init_seconds']):.3f}"),
        ("init_process_group, slowest rank (s)", lambda r, s: f"{max(r['init_seconds']):.3f}"),
        ("last rank in -> every rank out (s)", lambda r, s: f"{r['init_window_seconds']:.3f}"),
        ("worker anonymous RSS, largest (MiB)", lambda r, s: max(r["rss_anon_bytes"]) // MIB),
        ("mean loss after training", lambda r, s: f"{r['mean_loss_last']:.9f}"),
        ("parameters sha256", lambda r, s: r["params_sha256"][:16]),
    ]
    print(f"| {'':40s} | {'--store_proxy off':>18s} | {'--store_proxy on':>18s} |")
    print(f"|{'-' * 42}|{'-' * 19}:|{'-' * 19}:|")
    for name, get in rows:
        cells = [str(get(results[m][0], results[m][0]["store"])) for m in ("off", "on")]
        print(f"| {name:40s} | {cells[0]:>18s} | {cells[1]:>18s} |")
    print(f"| {'job: first agent start -> last exit (s)':40s} | {results['off'][1]:18.1f} | "
          f"{results['on'][1]:18.1f} |")
    for who in ("workers", "agents"):
        print(f"\n{who}' requests by op at the store (off / on):")
        ops = sorted(set(results["off"][0]["store"]["requests_by_op"][who]) |
                     set(results["on"][0]["store"]["requests_by_op"][who]))
        for op in ops:
            counts = [results[m][0]["store"]["requests_by_op"][who].get(op, 0) for m in ("off", "on")]
            print(f"  {op:14s} {counts[0]:8d} {counts[1]:8d}")

    off, on = results["off"][0], results["on"][0]
    same = (off["losses"] == on["losses"] and off["params_sha256"] == on["params_sha256"]
            and off["mean_loss_last"] == on["mean_loss_last"])
    print(f"\ntraining results {'identical' if same else 'DIFFER'} with the proxy off and on "
          f"(every rank's last loss, the parameters' sha256)")
    print(f"ended {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load average {loadavg()}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
