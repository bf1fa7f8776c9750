"""A plain torchrun-style elastic DDP script (nothing dlaunch-specific): gloo on CPU, init_method
env://, DDP steps until the file named by the first argument exists. Used by
tests/compat/torch_compat_test.cc to scale a running job up and down under dlaunch; each
membership change restarts the workers with a new WORLD_SIZE.

Each rank prints:
  rank R/W: joined                      once the process group is up
  rank R/W: step S                      every 10 steps (S counts from 1 in this process)
  rank R/W: done after S steps          when every rank saw the stop file
"""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    stop_file = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world}: joined", flush=True)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    step = 0
    while True:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        step += 1
        if step % 10 == 0:
            print(f"rank {rank}/{world}: step {step}", flush=True)
        # Every rank stops at the same step: the decision is all-reduced.
        stop = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() > 0:
            break
        time.sleep(0.02)
    print(f"rank {rank}/{world}: done after {step} steps", flush=True)
    dist.destroy_process_group()
    # PyTorch 2.15 sometimes aborts in the interpreter's finalization after a gloo DDP run
    # ("terminate called without an active exception", SIGABRT; gloo's threads still release
    # tensors while the interpreter is torn down: pytorch/pytorch#179291). Seen in 3 of 14 runs
    # of this test's last round, after every rank printed "done". The training is over and
    # checked by then, so the process leaves without the finalization.
    os._exit(0)


if __name__ == "__main__":
    main()
