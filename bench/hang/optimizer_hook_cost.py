"""What dlaunch's optimizer-step heartbeat (python/dlaunch_hooks/sitecustomize.py) costs a
training step, measured on Debian's PyTorch (1.13: the step wrapper; 2.x: the global post hook).

Runs the same loop in two fresh interpreters, with and without the hooks on PYTHONPATH (the way
dlaunch puts them there), and prints per-step medians of several rounds:
  - a no-op optimizer step: the hook's own cost in microseconds (the heartbeat file is touched at
    most once per 100 ms, so most steps pay one clock read);
  - a small real step (MLP forward/backward/SGD): the hook's cost as a share of the step.
Usage: /usr/bin/python3 bench/hang/optimizer_hook_cost.py [--rounds 7] [--steps 20000]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HOOKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "dlaunch_hooks")

CHILD = r"""
import json, sys, time, torch
steps, real_steps = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
torch.set_num_threads(1)

class NoOp(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, {})
    def step(self, closure=None):
        return None

p = torch.nn.Parameter(torch.zeros(1))
noop = NoOp([p])
for _ in range(1000):
    noop.step()
t = time.perf_counter()
for _ in range(steps):
    noop.step()
noop_us = (time.perf_counter() - t) / steps * 1e6

model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
loss_fn = torch.nn.CrossEntropyLoss()
def step():
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()
for _ in range(50):
    step()
t = time.perf_counter()
for _ in range(real_steps):
    step()
real_us = (time.perf_counter() - t) / real_steps * 1e6
# In this process, alternating (PyTorch 1.x: the wrapper keeps the original as __wrapped__): the
# hook's own cost without the noise between two processes.
inner = getattr(type(noop).step, "__wrapped__", None)
ab_us = None
if inner is not None:
    diffs = []
    for _ in range(21):
        t = time.perf_counter()
        for _ in range(steps // 10):
            noop.step()
        hooked = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(steps // 10):
            inner(noop)
        diffs.append((hooked - (time.perf_counter() - t)) / (steps // 10) * 1e6)
    diffs.sort()
    ab_us = diffs[len(diffs) // 2]
print(json.dumps({"noop_us": noop_us, "real_us": real_us, "ab_us": ab_us}))
"""


def run(hooks, steps, real_steps, beat_file):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("DLAUNCH_HEARTBEAT_FILE", None)
    if hooks:
        env["PYTHONPATH"] = os.path.abspath(HOOKS)
        env["DLAUNCH_HEARTBEAT_FILE"] = beat_file
    out = subprocess.run([sys.executable, "-c", CHILD, str(steps), str(real_steps)], env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--real_steps", type=int, default=2000)
    args = parser.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        beat = os.path.join(tmp, "heartbeat")
        rows = {False: [], True: []}
        for _ in range(args.rounds):
            for hooks in (False, True):  # interleaved: a noisy machine hits both alike
                rows[hooks].append(run(hooks, args.steps, args.real_steps, beat))
        beats = os.path.exists(beat)
    for hooks in (False, True):
        print(("with   " if hooks else "without") + " hooks, per round: " + ", ".join(
            f"{r['noop_us']:.2f}/{r['real_us']:.0f}" for r in rows[hooks]) + " (no-op us/MLP us)")
    med = {h: {k: statistics.median(r[k] for r in rows[h]) for k in ("noop_us", "real_us")}
           for h in rows}
    hook_us = med[True]["noop_us"] - med[False]["noop_us"]
    real_delta = med[True]["real_us"] - med[False]["real_us"]
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {args.rounds} rounds "
          f"(medians), heartbeat file touched: {beats}")
    print(f"no-op step:  {med[False]['noop_us']:.2f} us without hooks, "
          f"{med[True]['noop_us']:.2f} us with: the hook costs {hook_us:.2f} us per step")
    ab = [r["ab_us"] for r in rows[True] if r.get("ab_us") is not None]
    if ab:
        print(f"in one process, hooked step minus the unwrapped one (median of {len(ab)} rounds "
              f"x 21): {statistics.median(ab):.2f} us per step")
    print(f"MLP step:    {med[False]['real_us']:.1f} us without hooks, "
          f"{med[True]['real_us']:.1f} us with: {real_delta:+.1f} us "
          f"({real_delta / med[False]['real_us'] * 100:+.2f} %); the hook's own cost is "
          f"{hook_us / med[False]['real_us'] * 100:.2f} % of this step")


if __name__ == "__main__":
    main()
