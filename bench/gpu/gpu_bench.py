#!/usr/bin/env python3
"""dtrain against PyTorch 2.x on one GPU, side by side in one run (issue 11, docs/gpu.md
"Benchmarks"). scripts/gpu_check.sh --run BUNDLE --bench [SECTIONS] --out DIR runs it on the
GPU machine; it writes DIR/bench.md (tables) and DIR/bench.json (every figure) and prints the
tables.

Sections (comma-separated; default all):
  throughput  ResNet-18 (width 64) training steps with the data on the GPU, batch 128 and 512:
              PyTorch eager + autocast bf16 + channels_last, the same under torch.compile, dtrain
              bf16 and fp16 (--data_on_device on, synthetic data). Images/s, the ratios, peak GPU
              memory (nvidia-smi's per-process figure, sampled every 0.2 s, for both; PyTorch's
              allocator peak beside it), TFLOP/s at 3.3 GFLOP per training image and the share
              of the GPU's dense bf16 peak.
  accuracy    time to accuracy on full CIFAR-10 (the JPEG archive; bundle made --with-cifar):
              dtrain --recipe cifar-fast against the same recipe in PyTorch
              (torch_cifar_gpu.py train), bf16, 3 seeds each: test accuracy (flip TTA, averaged
              weights) and seconds from the first step to the end of the final evaluation.
  long        dtrain's default schedule for 100 epochs at width 64 on the archive, one seed.
  profile     where one step's time goes: dtrain's per-op device times (DTRAIN_PROFILE_OPS), and
              nsys's per-kernel summary of 30 steps of each side when nsys is installed, else
              PyTorch's own profiler for PyTorch.

  python3 gpu_bench.py --dtrain BIN/dtrain --out DIR [--sections throughput,accuracy]
                       [--archive cifar-10-jpeg.tar.gz] [--python PY] [--seeds 0,1,2]
                       [--device cpu --quick]   # the CPU self-test: small sizes, no GPU figures
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GFLOP_PER_IMAGE = 3.3  # ResNet-18 (CIFAR stem, width 64) forward + backward, per training image
# Dense bf16 tensor-core peaks (TFLOP/s) by the name nvidia-smi prints; NVIDIA's data sheets.
BF16_PEAK = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("H200", 989.4),
             ("A100", 312.0), ("L40S", 362.0)]


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        return out[0] if out else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def bf16_peak(name):
    for key, peak in BF16_PEAK:
        if key in name:
            return peak
    return None


class GpuMemorySampler:
    """The peak of nvidia-smi's used_memory for one process, polled every 0.2 s."""

    def __init__(self, pid):
        self.pid, self.peak_mib, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if shutil.which("nvidia-smi"):
            self._thread.start()

    def _run(self):
        while not self._stop.wait(0.2):
            try:
                out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                      "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            for line in out.splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) == 2 and parts[0] == str(self.pid) and parts[1].isdigit():
                    self.peak_mib = max(self.peak_mib, int(parts[1]))

    def stop(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.peak_mib or None


def run(cmd, log, env=None):
    """Runs cmd with its output in `log`; returns (exit code, output, peak GPU MiB)."""
    print("+ " + " ".join(cmd), flush=True)
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        sampler = GpuMemorySampler(proc.pid)
        rc = proc.wait()
        peak = sampler.stop()
    with open(log) as f:
        return rc, f.read(), peak


def last_json(text):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


class Bench:
    def __init__(self, args):
        self.a = args
        self.results = {"gpu": gpu_name() or "none", "sections": {}}
        self.logs = os.path.join(args.out, "bench_logs")
        os.makedirs(self.logs, exist_ok=True)
        self.md = [f"# dtrain vs PyTorch, {self.results['gpu']}\n"]

    def torch_cmd(self, what, *extra):
        return [self.a.python, os.path.join(HERE, "torch_cifar_gpu.py"), what, "--device", self.a.device, *extra]

    def dtrain_cmd(self, out_dir, *extra):
        shutil.rmtree(out_dir, ignore_errors=True)
        return [self.a.dtrain, "--device", self.a.device, "--output_dir", out_dir, "--resume", "none", *extra]

    # -------------------------------------------------------------------------------------------
    def throughput(self):
        q = self.a.quick
        width, steps, warmup = (8, 4, 2) if q else (64, 60, 15)
        batches = [32] if q else [128, 512]
        peak = bf16_peak(self.results["gpu"])
        rows = []
        for b in batches:
            common = ["--width", str(width), "--batch_size", str(b), "--steps", str(steps), "--warmup", str(warmup)]
            if q:
                common += ["--train_limit", "256", "--threads", "2"]
            for label, extra in [("PyTorch eager bf16 channels_last", ["--precision", "bf16", "--channels_last"]),
                                 ("PyTorch torch.compile bf16 channels_last",
                                  ["--precision", "bf16", "--channels_last", "--compile"])]:
                log = os.path.join(self.logs, f"torch_b{b}_{'compile' if '--compile' in extra else 'eager'}.log")
                rc, out, mib = run(self.torch_cmd("throughput", *common, *extra), log)
                res = last_json(out) or {}
                rows.append({"who": label, "batch": b, "rc": rc, "images_per_s": res.get("images_per_s"),
                             "gpu_mib": mib, "allocator_peak_mib": (res.get("peak_reserved_bytes") or 0) / 2**20 or None,
                             "note": res.get("unavailable", "" if rc == 0 else f"exit {rc}, {log}")})
            for p in ("bf16", "fp16"):
                d = os.path.join(self.a.out, "work", f"dtrain_b{b}_{p}")
                log = os.path.join(self.logs, f"dtrain_b{b}_{p}.log")
                # One window per step, and their median: the synthetic set is 5,000 images, so at
                # batch 512 every 9th step follows an epoch's end (its checkpoint), which a window
                # of several steps would include and the median of single steps leaves out.
                cmd = self.dtrain_cmd(d, "--precision", p, "--width", str(width), "--batch_size", str(b),
                                      "--dataset", "synthetic", "--data_on_device", "on", "--epochs", "1000",
                                      "--max_steps", str(steps + warmup), "--log_every", "1",
                                      "--eval_every", "0")
                env = dict(os.environ)
                if q:
                    env["DTRAIN_LIMIT_TRAIN_SAMPLES"] = "256"
                    cmd += ["--threads", "2"]
                rc, out, mib = run(cmd, log, env)
                ips = None
                if rc == 0:
                    windows = [r["images_per_s"] for r in metrics(os.path.join(d, "metrics.jsonl"))
                               if r.get("kind") == "step" and r.get("step", 0) > warmup]
                    ips = statistics.median(windows) if windows else None
                rows.append({"who": f"dtrain {p}", "batch": b, "rc": rc, "images_per_s": ips, "gpu_mib": mib,
                             "allocator_peak_mib": None, "note": "" if rc == 0 else f"exit {rc}, {log}"})
        for r in rows:
            ips = r["images_per_s"]
            # 3.3 GFLOP per image holds for width 64 only (the quick self-test's width 8 has none).
            r["tflops"] = ips * GFLOP_PER_IMAGE / 1e3 if (ips and width == 64) else None
            r["peak_share"] = r["tflops"] / peak if (r["tflops"] and peak) else None
        self.results["sections"]["throughput"] = rows
        self.md.append(f"## Throughput, ResNet-18 width {width}, data on the device\n")
        self.md.append("| batch | who | img/s | x PyTorch eager | x torch.compile | TFLOP/s | of bf16 peak | GPU MiB (nvidia-smi) | allocator peak MiB | note |")
        self.md.append("|---|---|---|---|---|---|---|---|---|---|")
        for b in batches:
            ref = {r["who"].split(" ")[1]: r["images_per_s"] for r in rows if r["batch"] == b and r["who"].startswith("PyTorch")}
            for r in (r for r in rows if r["batch"] == b):
                ips = r["images_per_s"]

                def ratio(x):
                    return f"{ips / x:.2f}" if (ips and x) else ""

                self.md.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
                    b, r["who"], f"{ips:.0f}" if ips else "-", ratio(ref.get("eager")), ratio(ref.get("torch.compile")),
                    f"{r['tflops']:.1f}" if r["tflops"] else "", f"{100 * r['peak_share']:.1f}%" if r["peak_share"] else "",
                    r["gpu_mib"] or "", f"{r['allocator_peak_mib']:.0f}" if r["allocator_peak_mib"] else "", r["note"]))
        self.md.append("")

    # -------------------------------------------------------------------------------------------
    def accuracy(self):
        q = self.a.quick
        data = self.a.archive
        if not data:
            self.md.append("## Time to accuracy\n\nskipped: no CIFAR-10 archive (make the bundle --with-cifar)\n")
            self.results["sections"]["accuracy"] = "skipped: no archive"
            return
        rows = []
        for seed in self.a.seeds:
            d = os.path.join(self.a.out, "work", f"dtrain_fast_{seed}")
            cmd = self.dtrain_cmd(d, "--recipe", "cifar-fast", "--precision", "bf16", "--seed", str(seed),
                                  "--dataset", "cifar10" if os.path.isdir(data) else "imagefolder",
                                  "--data_dir", data, "--eval_every", "0", "--log_every", "50")
            env = dict(os.environ)
            extra_torch = []
            if q:
                cmd += ["--width", "8", "--epochs", "1", "--batch_size", "100", "--threads", "2"]
                env["DTRAIN_LIMIT_TRAIN_SAMPLES"], env["DTRAIN_LIMIT_TEST_SAMPLES"] = "1000", "500"
                extra_torch = ["--width", "8", "--epochs", "1", "--batch_size", "100", "--threads", "2",
                               "--train_limit", "1000", "--test_limit", "500"]
            rc, out, _ = run(cmd, os.path.join(self.logs, f"dtrain_fast_{seed}.log"), env)
            acc = secs = None
            if rc == 0:
                epochs = [r for r in metrics(os.path.join(d, "metrics.jsonl")) if r.get("kind") == "epoch"]
                secs = sum(r["epoch_time_s"] for r in epochs)
                acc = epochs[-1].get("test_accuracy")
            rows.append({"who": "dtrain", "seed": seed, "rc": rc, "test_accuracy": acc, "seconds": secs})
            rc, out, _ = run(self.torch_cmd("train", "--data", data, "--seed", str(seed), "--precision", "bf16",
                                            "--channels_last", *extra_torch),
                             os.path.join(self.logs, f"torch_fast_{seed}.log"))
            res = last_json(out) or {}
            rows.append({"who": "PyTorch", "seed": seed, "rc": rc, "test_accuracy": res.get("test_accuracy"),
                         "seconds": res.get("seconds")})
        self.results["sections"]["accuracy"] = rows
        self.md.append(f"## Time to accuracy, --recipe cifar-fast (bf16), data {os.path.basename(data)}\n")
        self.md.append("| who | seeds | test accuracy per seed | mean | seconds per seed | mean s |")
        self.md.append("|---|---|---|---|---|---|")
        for who in ("dtrain", "PyTorch"):
            rs = [r for r in rows if r["who"] == who]
            accs = [r["test_accuracy"] for r in rs if r["test_accuracy"] is not None]
            secs = [r["seconds"] for r in rs if r["seconds"] is not None]
            self.md.append("| {} | {} | {} | {} | {} | {} |".format(
                who, ",".join(str(r["seed"]) for r in rs),
                ", ".join(f"{100 * r['test_accuracy']:.2f}%" if r["test_accuracy"] is not None else f"exit {r['rc']}" for r in rs),
                f"{100 * statistics.mean(accs):.2f}%" if accs else "-",
                ", ".join(f"{r['seconds']:.1f}" if r["seconds"] is not None else "-" for r in rs),
                f"{statistics.mean(secs):.1f}" if secs else "-"))
        self.md.append("")

    # -------------------------------------------------------------------------------------------
    def long(self):
        if not self.a.archive:
            self.results["sections"]["long"] = "skipped: no archive"
            return
        d = os.path.join(self.a.out, "work", "dtrain_long")
        epochs = "1" if self.a.quick else "100"
        cmd = self.dtrain_cmd(d, "--width", "8" if self.a.quick else "64", "--epochs", epochs,
                              "--dataset", "cifar10" if os.path.isdir(self.a.archive) else "imagefolder",
                              "--data_dir", self.a.archive, "--precision", "bf16", "--eval_every", "10", "--log_every", "100")
        env = dict(os.environ)
        if self.a.quick:
            env["DTRAIN_LIMIT_TRAIN_SAMPLES"], env["DTRAIN_LIMIT_TEST_SAMPLES"] = "1000", "500"
            cmd += ["--threads", "2"]
        rc, _, _ = run(cmd, os.path.join(self.logs, "dtrain_long.log"), env)
        row = {"rc": rc}
        if rc == 0:
            epochs_rec = [r for r in metrics(os.path.join(d, "metrics.jsonl")) if r.get("kind") == "epoch"]
            row.update(seconds=sum(r["epoch_time_s"] for r in epochs_rec), test_accuracy=epochs_rec[-1].get("test_accuracy"))
        self.results["sections"]["long"] = row
        self.md.append(f"## dtrain's default schedule, {epochs} epochs, width {'8' if self.a.quick else '64'}, bf16\n")
        self.md.append(f"exit {rc}; " + (f"test accuracy {100 * row['test_accuracy']:.2f}%, {row['seconds']:.1f} s of training and evaluation\n"
                                          if rc == 0 and row.get("test_accuracy") is not None else "no result\n"))

    # -------------------------------------------------------------------------------------------
    def profile(self):
        q = self.a.quick
        width, batch, steps = ("8", "32", "8") if q else ("64", "512", "30")
        self.md.append(f"## Where the time goes, width {width}, batch {batch}, bf16\n")
        res = {}
        # dtrain's own op table (DTRAIN_PROFILE_OPS, kernels/op_timing_backend.h): each op waits for
        # the device before and after itself, so the shares are the ops' device times.
        d = os.path.join(self.a.out, "work", "dtrain_ops")
        table = os.path.join(self.a.out, "dtrain_op_times.txt")
        env = dict(os.environ, DTRAIN_PROFILE_OPS=table, DTRAIN_PROFILE_OPS_SKIP="3" if q else "10",
                   DTRAIN_LIMIT_TEST_SAMPLES="1")
        cmd = self.dtrain_cmd(d, "--precision", "bf16", "--width", width, "--batch_size", batch, "--dataset",
                              "synthetic", "--data_on_device", "on", "--epochs", "1000", "--max_steps", steps,
                              "--eval_every", "0")
        if q:
            cmd += ["--threads", "2"]
            env["DTRAIN_LIMIT_TRAIN_SAMPLES"] = "256"
        rc, _, _ = run(cmd, os.path.join(self.logs, "dtrain_op_times.log"), env)
        res["dtrain_ops_rc"] = rc
        text = open(table).read() if rc == 0 and os.path.exists(table) else f"exit {rc}"
        self.md.append(f"### dtrain, DTRAIN_PROFILE_OPS ({steps} steps)\n```\n{text}```\n")
        nsys = shutil.which("nsys")
        if nsys:
            for who, cmd in [("dtrain", self.dtrain_cmd(os.path.join(self.a.out, "work", "dtrain_prof"), "--precision",
                                                       "bf16", "--width", width, "--batch_size", batch, "--dataset",
                                                       "synthetic", "--data_on_device", "on", "--epochs", "1000",
                                                       "--max_steps", steps, "--eval_every", "0")),
                             ("torch", self.torch_cmd("throughput", "--precision", "bf16", "--channels_last", "--width",
                                                      width, "--batch_size", batch, "--steps", steps, "--warmup", "5"))]:
                rep = os.path.join(self.a.out, f"nsys_{who}")
                rc, _, _ = run([nsys, "profile", "--force-overwrite", "true", "-o", rep, *cmd],
                               os.path.join(self.logs, f"nsys_{who}.log"))
                stats = subprocess.run([nsys, "stats", "--report", "cuda_gpu_kern_sum", "--format", "table",
                                        rep + ".nsys-rep"], capture_output=True, text=True).stdout
                res[f"nsys_{who}_rc"] = rc
                top = "\n".join(stats.splitlines()[:30])
                self.md.append(f"### {who}, nsys cuda_gpu_kern_sum ({steps} steps), top kernels\n```\n{top}\n```\n")
        else:
            self.md.append("nsys is not installed here: no per-kernel profile of either side; PyTorch's own profiler:\n")
            log = os.path.join(self.logs, "torch_profile.log")
            rc, out, _ = run([self.a.python, "-c", TORCH_PROFILE, HERE, self.a.device, width, batch], log)
            res["torch_profiler_rc"] = rc
            self.md.append("```\n" + (out if rc == 0 else f"exit {rc} (see {log})") + "\n```\n")
        self.results["sections"]["profile"] = res


TORCH_PROFILE = r"""
import sys, torch
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/../train")
import torch.nn.functional as F
from torch_resnet import ResNet
dev = torch.device(sys.argv[2])
width, batch = int(sys.argv[3]), int(sys.argv[4])
m = ResNet(18, width).to(dev, memory_format=torch.channels_last)
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
x = torch.randn(batch, 3, 32, 32, device=dev).contiguous(memory_format=torch.channels_last)
y = torch.randint(0, 10, (batch,), device=dev)
def step():
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        loss = F.cross_entropy(m(x), y)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
for _ in range(10): step()
acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda" else [])
with torch.profiler.profile(activities=acts) as prof:
    for _ in range(5): step()
    if dev.type == "cuda": torch.cuda.synchronize()
key = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
print(prof.key_averages().table(sort_by=key, row_limit=20))
"""


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtrain", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sections", default="throughput,accuracy,long,profile")
    p.add_argument("--archive", default="")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny sizes: the CPU self-test of this script")
    a = p.parse_args()
    a.seeds = [int(s) for s in a.seeds.split(",")]
    os.makedirs(a.out, exist_ok=True)
    bench = Bench(a)
    known = {"throughput", "accuracy", "long", "profile"}
    for s in a.sections.split(","):
        if s not in known:
            sys.exit(f"gpu_bench.py: unknown section '{s}'; expected some of {', '.join(sorted(known))}")
    started = time.time()
    for s in a.sections.split(","):
        getattr(bench, s)()
    bench.results["seconds"] = time.time() - started
    with open(os.path.join(a.out, "bench.json"), "w") as f:
        json.dump(bench.results, f, indent=1)
    text = "\n".join(bench.md)
    with open(os.path.join(a.out, "bench.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    failed = [r for rows in bench.results["sections"].values() if isinstance(rows, list) for r in rows
              if r.get("rc") not in (0, 3)]
    failed += [k for k, v in (bench.results["sections"].get("profile") or {}).items() if k.endswith("_rc") and v != 0]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
