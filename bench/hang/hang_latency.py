"""How long after a rank of an unmodified PyTorch DDP script gets stuck dlaunch declares the hang
and names the root cause (issue 13: within --hang_timeout + 1 s), with dlaunch's Python hooks
(optimizer-step heartbeats) and Debian's PyTorch 1.13, gloo on CPU.

Runs tests/compat/ddp_hang.py (rank 1 blocks forever at step 5 and prints the time) under
dlaunch several times and prints, per run and as medians: stuck -> "is hung" (detection),
stuck -> "root cause of the hang" (after the Python and native stacks), and whether the root
cause named is rank 1.
Usage: bench/hang/hang_latency.py build/bin/dlaunch [--runs 5] [--hang_timeout 3] [--nproc 2]
"""
import argparse
import datetime
import os
import re
import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "tests", "compat", "ddp_hang.py")
LOG_TIME = re.compile(r"^\[dlaunch (\d\d):(\d\d):(\d\d)\.(\d{3}) \w\] ")


def log_time(line, day):
    m = LOG_TIME.match(line)
    if not m:
        return None
    h, mi, s, ms = (int(g) for g in m.groups())
    return day.replace(hour=h, minute=mi, second=s, microsecond=ms * 1000).timestamp()


def one_run(dlaunch, timeout, nproc):
    with tempfile.TemporaryDirectory() as logs:
        env = dict(os.environ, PATH="/usr/bin:" + os.environ.get("PATH", ""))
        p = subprocess.run([dlaunch, "--standalone", "--nproc_per_node", str(nproc),
                            "--hang_timeout", str(timeout), "--log_dir", logs,
                            "--python", "/usr/bin/python3", SCRIPT],
                           env=env, capture_output=True, text=True, timeout=600)
    stuck = re.search(r"rank 1: stuck now at ([0-9.]+)", p.stdout)
    if not stuck:
        raise SystemExit("no 'stuck now' line:\n" + p.stdout + p.stderr)
    stuck_at = float(stuck.group(1))
    day = datetime.datetime.fromtimestamp(stuck_at)
    detected = blamed = None
    root = None
    for line in p.stderr.splitlines():
        if detected is None and "is hung" in line:
            detected = log_time(line, day)
        if blamed is None and "root cause of the hang" in line:
            blamed = log_time(line, day)
            m = re.search(r"local rank (\d+) \(rank (\d+)", line)
            root = int(m.group(2)) if m else None
    if detected is None or blamed is None:
        raise SystemExit("no hang was reported:\n" + p.stderr)
    return detected - stuck_at, blamed - stuck_at, root


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dlaunch")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hang_timeout", type=float, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for i in range(args.runs):
        det, blame, root = one_run(args.dlaunch, args.hang_timeout, args.nproc)
        rows.append((det, blame, root))
        print(f"run {i}: stuck -> detected {det:.2f} s, -> root cause named {blame:.2f} s, "
              f"root cause rank {root}", flush=True)
    det = statistics.median(r[0] for r in rows)
    blame = statistics.median(r[1] for r in rows)
    right = sum(1 for r in rows if r[2] == 1)
    print(f"--hang_timeout {args.hang_timeout:g}, {args.nproc} ranks, {args.runs} runs: median "
          f"stuck -> detected {det:.2f} s (timeout + {det - args.hang_timeout:.2f} s), -> root "
          f"cause named {blame:.2f} s; rank 1 named in {right}/{args.runs}")


if __name__ == "__main__":
    main()
