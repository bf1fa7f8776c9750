#!/usr/bin/python3
"""dtrain's training throughput beside PyTorch's (1.13 and, with --torch_python, 2.x eager and
torch.compile), same model, batch and worker layout, in one run (the machine is shared and
noisy: compare the ratio, repeat with --repeats).

Layouts: one process with 2 threads; 2 workers x 1 thread (plain BN); 2 workers x 1 thread
with SyncBN for dtrain (PyTorch's SyncBatchNorm refuses CPU tensors, so its figure there is
plain DDP). Both frameworks' 2-worker runs are started by dlaunch (PyTorch's script is plain DDP, as it
would run under torchrun).

dtrain's figure: the median of its per-window images/s (metrics.jsonl step lines, the first
window dropped as warm-up), data loading and augmentation included. PyTorch's: a fixed batch,
no data loading (torch_ddp_bench.py).

  /usr/bin/python3 bench/train/throughput.py --build build --widths 16 64 --batch_size 128
  /usr/bin/python3 bench/train/throughput.py --widths 16 64 --compile \\
      --torch_python /usr/bin/python3 ~/.cache/dlaunch/venv-torch-2.15.0/bin/python
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, env):
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}")
    return r.stdout


def dtrain_ips(build, width, batch, steps, workers, threads, sync_bn):
    out = tempfile.mkdtemp(prefix="dtrain_bench_")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), DTRAIN_LIMIT_TEST_SAMPLES="256")
    log_every = max(2, steps // 6)
    args = [f"--width={width}", f"--batch_size={batch}", f"--max_steps={steps}",
            f"--log_every={log_every}", "--eval_every=0", "--epochs=1", "--resume=none",
            f"--threads={threads}", f"--output_dir={out}"]
    if sync_bn:
        args.append("--sync_bn")
    dtrain = os.path.join(build, "bin", "dtrain")
    if workers == 1:
        run([dtrain] + args, env)
    else:
        run([os.path.join(build, "bin", "dlaunch"), "--standalone", f"--nproc_per_node={workers}",
             dtrain] + args, env)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        steps_ips = [json.loads(l)["images_per_s"] for l in f if '"kind":"step"' in l]
    shutil.rmtree(out, ignore_errors=True)
    return statistics.median(steps_ips[1:] if len(steps_ips) > 1 else steps_ips)


def torch_ips(build, width, batch, steps, workers, threads, python, compiled):
    bench = os.path.join(HERE, "torch_ddp_bench.py")
    args = [f"--width={width}", f"--batch_size={batch}", f"--steps={steps}", f"--threads={threads}"]
    if compiled:
        args.append("--compile")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if workers == 1:
        out = run([python, bench] + args, env)
    else:
        # dlaunch starts the PyTorch workers too: torchrun --standalone's fixed port 29400
        # collides with other jobs on a shared machine. The workers are the same either way.
        out = run([os.path.join(build, "bin", "dlaunch"), "--standalone",
                   f"--nproc_per_node={workers}", f"--python={python}", bench] + args, env)
    # Under dlaunch the line carries a "[default0]:" prefix.
    line = [l for l in out.splitlines() if '{"images_per_s"' in l][-1]
    return json.loads(line[line.index("{"):])["images_per_s"]


def peers(pythons, compile_2x):
    """(label, python, compiled) per PyTorch column: each interpreter's eager mode, and
    torch.compile for the 2.x ones when asked."""
    out = []
    for python in pythons:
        r = subprocess.run([python, "-c", "import torch; print(torch.__version__.split('+')[0])"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if r.returncode != 0:
            print(f"peer: {python} has no torch; its column is left out")
            continue
        version = r.stdout.strip()
        out.append((f"torch {version}", python, False))
        if compile_2x and not version.startswith("1."):
            out.append((f"torch {version} compile", python, True))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--widths", type=int, nargs="+", default=[16])
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--steps", type=int, default=0, help="0: 30 at width <= 16, else 12")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--layouts", nargs="+", default=["1x2", "2x1", "2x1-syncbn"])
    p.add_argument("--torch_python", nargs="+", default=["/usr/bin/python3"],
                   help="interpreters whose PyTorch is the peer, e.g. /usr/bin/python3 and the "
                        "2.15 venv's python (scripts/setup_torch2.sh)")
    p.add_argument("--compile", action="store_true",
                   help="also torch.compile with each 2.x peer (its warm-up steps compile)")
    args = p.parse_args()
    columns = peers(args.torch_python, args.compile)
    header = f"{'width':>5} {'layout':>11} {'dtrain img/s':>13}"
    for label, _, _ in columns:
        header += f" | {label + ' img/s':>24} {'ratio':>6}"
    print(header)
    for width in args.widths:
        steps = args.steps or (30 if width <= 16 else 12)
        for layout in args.layouts:
            workers, threads = (1, 2) if layout == "1x2" else (2, 1)
            sync = layout.endswith("syncbn")
            ours, theirs = [], {label: [] for label, _, _ in columns}
            for _ in range(args.repeats):
                ours.append(dtrain_ips(args.build, width, args.batch_size, steps, workers, threads, sync))
                for label, python, compiled in columns:
                    theirs[label].append(torch_ips(args.build, width, args.batch_size, steps,
                                                   workers, threads, python, compiled))
            o = statistics.median(ours)
            line = f"{width:>5} {layout:>11} {o:>13.1f}"
            for label, _, _ in columns:
                t = statistics.median(theirs[label])
                line += f" | {t:>24.1f} {o / t:>6.2f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
