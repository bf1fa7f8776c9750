"""An unmodified torchrun-style DDP script (gloo, CPU) in which one rank stops making progress:
nothing in it knows about dlaunch or heartbeats. Used by tests/compat/torch_compat_test.cc to
check that `dlaunch --hang_timeout` catches it through dlaunch's sitecustomize (optimizer-step
heartbeats, faulthandler stacks) and names the stuck rank, not the ranks waiting for it.

COMPAT_HANG_RANK (default 1) blocks forever in wait_for_a_batch_that_never_comes() at step
COMPAT_HANG_STEP (default 5), on the first COMPAT_HANG_ATTEMPTS attempts (default 1); in a later
attempt every rank runs --steps steps and prints "rank R/W: done steps=N attempt=A".
"""
import argparse
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def wait_for_a_batch_that_never_comes():
    print(f"rank {dist.get_rank()}: stuck now at {time.time():.3f}", flush=True)
    threading.Event().wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step_seconds", type=float, default=0.05)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    hang_rank = int(os.environ.get("COMPAT_HANG_RANK", "1"))
    hang_step = int(os.environ.get("COMPAT_HANG_STEP", "5"))
    hang_attempts = int(os.environ.get("COMPAT_HANG_ATTEMPTS", "1"))
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if attempt < hang_attempts and rank == hang_rank and step == hang_step:
            wait_for_a_batch_that_never_comes()
        x = torch.randn(8, 16)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        time.sleep(args.step_seconds)
    dist.barrier()
    print(f"rank {rank}/{world}: done steps={args.steps} attempt={attempt}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
