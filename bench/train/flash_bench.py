#!/usr/bin/python3
"""Flash checkpoints (issue 14): what they cost and what they buy.

cost      dtrain under dlaunch (2 workers x 1 thread) with --flash_every 1 at each --widths: the
          mean time of one flash copy (dtrain logs it) against the median step time (from the
          step lines of metrics.jsonl), and the fraction of step time at --flash_every N.
recovery  a worker SIGKILLed in the middle of epoch 2: seconds from the kill to the next step
          logged, and the steps lost, for dlaunch + dtrain (--flash_every, the default unless
          given) and for torchrun + a PyTorch script with per-epoch checkpoints
          (torch_epoch_ckpt.py, the usual practice), the same network, batch and epoch length.
          Every run, then the distribution (min, median, max) of --runs; ours, the peer's and
          the ratio of the medians. --timeline also prints, for each of our runs, every log
          line of dlaunch and dtrain (debug level) from the kill to the next step, with its
          offset from the kill: where the time goes.

  /usr/bin/python3 bench/train/flash_bench.py cost --widths 16,64
  /usr/bin/python3 bench/train/flash_bench.py recovery --runs 3
  /usr/bin/python3 bench/train/flash_bench.py recovery --runs 1 --no_peer --timeline

The build is ./build (--build). torchrun is Debian's python3-torch 1.13 (/usr/bin/python3).
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def env_with(extra):
    env = dict(os.environ)
    env["PATH"] = "/usr/bin:" + env.get("PATH", "")
    env.update(extra)
    return env


def step_lines(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    j = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if j.get("kind", "step") == "step" and "step" in j:
                    out.append(j)
    except FileNotFoundError:
        pass
    return out


def cost(args):
    print(f"flash copy cost: dtrain, 2 workers x 1 thread, batch {args.batch_size}, --flash_every 1")
    for width in [int(w) for w in args.widths.split(",")]:
        tmp = tempfile.mkdtemp(prefix="flash_cost_")
        try:
            samples = args.batch_size * 2 * args.steps
            cmd = [f"{args.build}/bin/dlaunch", "--standalone", "--nproc_per_node", "2",
                   f"{args.build}/bin/dtrain", f"--width={width}",
                   f"--batch_size={args.batch_size}", "--epochs=1", "--log_every=1",
                   "--flash_every=1", f"--output_dir={tmp}/out"]
            r = subprocess.run(cmd, env=env_with({"DTRAIN_LIMIT_TRAIN_SAMPLES": str(samples),
                                                  "DTRAIN_LIMIT_TEST_SAMPLES": "64",
                                                  "DLAUNCH_CONV_ALGO": "direct",
                                                  "DLAUNCH_CONV_CACHE": "off"}),
                               capture_output=True, text=True, timeout=3600)
            m = re.search(r"flash copies: (\d+) mid-epoch writes.*?, ([\d.]+) ms each", r.stderr + r.stdout)
            if r.returncode != 0 or not m:
                sys.exit(f"width {width}: dtrain failed or logged no flash cost:\n{r.stderr[-3000:]}")
            writes, copy_ms = int(m.group(1)), float(m.group(2))
            lines = step_lines(f"{tmp}/out/metrics.jsonl")[1:]  # the first step pays start-up
            step_ms = statistics.median(1e3 * args.batch_size * 2 / j["images_per_s"] for j in lines)
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(f"{tmp}/out")
                       for f in fs if f.endswith(".dtck"))
            print(f"  width {width}: {writes} copies, {copy_ms:.2f} ms each "
                  f"({size / 2**20:.1f} MiB checkpoint); median step {step_ms:.0f} ms; "
                  f"cost per step at --flash_every 1: {100 * copy_ms / step_ms:.2f}%, "
                  f"at --flash_every {args.every}: {100 * copy_ms / step_ms / args.every:.3f}%")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def worker_pid(parent, local_rank):
    """The pid of the worker with LOCAL_RANK=local_rank among the descendants of `parent`."""
    children = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(p))
        except (OSError, IndexError, ValueError):
            continue
    todo, seen = [parent], []
    while todo:
        q = todo.pop()
        for c in children.get(q, []):
            seen.append(c)
            todo.append(c)
    for pid in seen:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            if f"LOCAL_RANK={local_rank}".encode() in env and b"RANK=" + str(local_rank).encode() in env:
                return pid
        except OSError:
            continue
    return None


def kill_and_watch(cmd, env, metrics, kill_after_step, timeout=600, log=None):
    """Starts the job, SIGKILLs local rank 1 once step `kill_after_step` is logged, and returns
    (seconds from the kill to the next step logged, steps lost, kill time, next-step time).
    The job's output goes to the file `log` when given."""
    out = open(log, "w") if log else subprocess.DEVNULL
    job = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
                           start_new_session=True)
    if log:
        out.close()
    try:
        deadline = time.time() + timeout
        while True:
            lines = step_lines(metrics)
            if lines and lines[-1]["step"] >= kill_after_step:
                break
            if job.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the job ended or timed out before step {kill_after_step}")
            time.sleep(0.005)
        pid = worker_pid(job.pid, 1)
        if pid is None:
            raise RuntimeError("no worker with LOCAL_RANK=1 found")
        before = len(step_lines(metrics))
        last = step_lines(metrics)[-1]["step"]
        os.kill(pid, signal.SIGKILL)
        t_kill = time.time()
        while True:
            lines = step_lines(metrics)
            if len(lines) > before:
                t_next = time.time()
                first = lines[before]["step"]
                return t_next - t_kill, last - (first - 1), t_kill, t_next
            if job.poll() is not None or time.time() > deadline:
                raise RuntimeError("no step logged after the kill")
            time.sleep(0.002)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()


LOG_TIME = re.compile(r"^(?:\[\w+\]:)?\[(?:dlaunch|dtrain rank \d+) (\d\d):(\d\d):(\d\d)\.(\d{3}) \w\] ")


def print_timeline(log, t_kill, t_next):
    """Every time-stamped line of the job's log between the kill and the next step, as its
    offset from the kill in milliseconds (the log's clock is local time of day)."""
    day = time.localtime(t_kill)
    midnight = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, 0, 0, 0, 0, 0, -1))
    print(f"    timeline (ms after the kill; next step seen at {1e3 * (t_next - t_kill):.0f}):")
    with open(log, errors="replace") as f:
        for line in f:
            m = LOG_TIME.match(line)
            if not m:
                continue
            h, mi, s, ms = (int(g) for g in m.groups())
            t = midnight + h * 3600 + mi * 60 + s + ms / 1e3
            if t_kill - 0.001 <= t <= t_next:
                print(f"    {1e3 * (t - t_kill):6.0f}  {line.strip()[:150]}")


def spread(xs):
    xs = sorted(xs)
    return f"min {xs[0]:.2f}, median {statistics.median(xs):.2f}, max {xs[-1]:.2f}"


def recovery(args):
    steps_per_epoch = args.samples // 2 // args.batch_size
    kill_after = steps_per_epoch + steps_per_epoch // 2 + 1  # mid epoch 2
    ours, peer = [], []
    for run in range(args.runs):
        tmp = tempfile.mkdtemp(prefix="flash_recovery_")
        try:
            cmd = [f"{args.build}/bin/dlaunch", "--standalone", "--nproc_per_node", "2",
                   "--max_restarts", "1", f"{args.build}/bin/dtrain", f"--width={args.width}",
                   f"--batch_size={args.batch_size}", "--epochs=3", "--log_every=1",
                   f"--output_dir={tmp}/dtrain"]
            if args.flash_every is not None:
                cmd.append(f"--flash_every={args.flash_every}")
            env = env_with({"DTRAIN_LIMIT_TRAIN_SAMPLES": str(args.samples),
                            "DTRAIN_LIMIT_TEST_SAMPLES": "64", "OMP_NUM_THREADS": "1",
                            "DLAUNCH_CONV_ALGO": "direct", "DLAUNCH_CONV_CACHE": "off"})
            if args.timeline:
                env["DLAUNCH_LOG_LEVEL"] = "debug"
            log = f"{tmp}/dlaunch.log" if args.timeline else None
            ours.append(kill_and_watch(cmd, env, f"{tmp}/dtrain/metrics.jsonl", kill_after, log=log))
            if args.timeline:
                steps = step_lines(f"{tmp}/dtrain/metrics.jsonl")[1:kill_after]
                step_ms = statistics.median(1e3 * args.batch_size * 2 / j["images_per_s"] for j in steps)
                print(f"    median step before the kill: {step_ms:.0f} ms")
                print_timeline(log, ours[-1][2], ours[-1][3])
            if args.no_peer:
                print(f"  run {run + 1}: dlaunch+dtrain {ours[-1][0]:.2f} s, {ours[-1][1]} steps lost",
                      flush=True)
                continue
            os.makedirs(f"{tmp}/torch")
            cmd = ["/usr/bin/python3", "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", "2", "--max_restarts", "1", "-r", "1", "-t", "1",
                   f"{HERE}/torch_epoch_ckpt.py", f"--width={args.width}",
                   f"--batch_size={args.batch_size}", f"--samples={args.samples}",
                   f"--out={tmp}/torch", f"--metrics={tmp}/torch/metrics.jsonl"]
            peer.append(kill_and_watch(cmd, env_with({"OMP_NUM_THREADS": "1"}),
                                       f"{tmp}/torch/metrics.jsonl", kill_after))
            print(f"  run {run + 1}: dlaunch+dtrain {ours[-1][0]:.2f} s, {ours[-1][1]} steps lost; "
                  f"torchrun+PyTorch {peer[-1][0]:.2f} s, {peer[-1][1]} steps lost", flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
    print(f"worker SIGKILLed after step {kill_after} (epoch 2 of {steps_per_epoch} steps), width "
          f"{args.width}, batch {args.batch_size} x 2 workers, {args.runs} runs "
          f"(load average {os.getloadavg()[0]:.1f} at the end):")
    print(f"  kill -> next step logged, s: dlaunch+dtrain {spread([x[0] for x in ours])}; "
          f"within 1 s in {sum(x[0] <= 1.0 for x in ours)} of {len(ours)}")
    print(f"  steps lost: dlaunch+dtrain {med(ours, 1):g} (worst {max(x[1] for x in ours)})")
    if peer:
        print(f"  kill -> next step logged, s: torchrun+PyTorch {spread([x[0] for x in peer])}; "
              f"ratio of the medians {med(peer, 0) / med(ours, 0):.1f}x")
        print(f"  steps lost: torchrun+PyTorch {med(peer, 1):g} (worst {max(x[1] for x in peer)})")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(HERE, "..", "..", "build"))
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cost")
    c.add_argument("--widths", default="16,64")
    c.add_argument("--batch_size", type=int, default=32)
    c.add_argument("--steps", type=int, default=12)
    c.add_argument("--every", type=int, default=20, help="the interval to report the cost at")
    r = sub.add_parser("recovery")
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--width", type=int, default=16)
    r.add_argument("--batch_size", type=int, default=32)
    r.add_argument("--samples", type=int, default=2048)
    r.add_argument("--flash_every", type=int, default=None)
    r.add_argument("--timeline", action="store_true", help="print where our recovery's time goes")
    r.add_argument("--no_peer", action="store_true", help="skip torchrun (e.g. with --timeline)")
    args = p.parse_args()
    args.build = os.path.abspath(args.build)
    cost(args) if args.what == "cost" else recovery(args)


if __name__ == "__main__":
    main()
