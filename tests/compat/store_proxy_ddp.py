"""A small DDP training (gloo, CPU, fixed seeds) whose result must not depend on how the workers
reach the job's store: run once with --store_proxy off and once on, the two outputs must carry
the same losses and parameters. Also what the store saw while the workers started: rank 0 reads
the store's section of /status (connections open now, the most at once, accepted, channels
opened by nodes' proxies, requests by op) once every rank is past init_process_group.

Rank 0 writes --output (JSON):
  world_size, steps
  losses: every rank's own loss at the last step (its own data shard), by rank
  mean_loss_first, mean_loss_last: the loss averaged over ranks, before and after training
  params_sha256: the bytes of every parameter after the last step (DDP keeps them equal)
  init_seconds: by rank, how long init_process_group took in that rank
  init_window_seconds: the last rank entering init_process_group -> the last one leaving it
  rss_anon_bytes: by rank, the process's anonymous resident memory at the end
  store: the store's section of /status (from whichever agent hosts the store)

Used by tests/compat/store_traffic_test.cc (2 nodes x 2 workers) and
bench/store_proxy/real_workers.py (16 nodes x 4 workers, or what fits).
"""
import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from store_traffic import store_status  # beside this file: the store's section of /status


def rss_anon_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def gather(values, dtype=torch.float64):
    """Each rank's values, by rank, over the process group (gloo: no store request)."""
    mine = torch.tensor(values, dtype=dtype)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [t.tolist() for t in every]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--status_url", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()

    init_began = time.clock_gettime(time.CLOCK_MONOTONIC)
    dist.init_process_group("gloo")  # env:// from the agent: MASTER_ADDR/PORT name the store or proxy
    init_ended = time.clock_gettime(time.CLOCK_MONOTONIC)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(1 + rank)  # different initial weights per rank: DDP broadcasts rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank has its own shard
    x = torch.randn(64, 8, generator=data)
    y = x @ torch.linspace(-1.0, 1.0, 8).unsqueeze(1) + 0.5
    losses = []
    for _ in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())

    mean = torch.tensor([losses[0], losses[-1]], dtype=torch.float64)
    dist.all_reduce(mean)
    mean /= world
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().contiguous().numpy().tobytes())
    by_rank = gather([losses[-1], init_began, init_ended, float(rss_anon_bytes())])
    # Every rank is past its store requests (init is the only part that makes any): the counts
    # rank 0 reads now are the whole job's.
    if rank == 0:
        store = store_status(args.status_url)
        with open(args.output, "w") as f:
            json.dump({
                "world_size": world,
                "steps": args.steps,
                "losses": [r[0] for r in by_rank],
                "mean_loss_first": mean[0].item(),
                "mean_loss_last": mean[1].item(),
                "params_sha256": digest.hexdigest(),
                "init_seconds": [r[2] - r[1] for r in by_rank],
                "init_window_seconds": max(r[2] for r in by_rank) - max(r[1] for r in by_rank),
                "rss_anon_bytes": [int(r[3]) for r in by_rank],
                "store": store,
            }, f)
    print(f"rank {rank}/{world}: loss {losses[-1]:.9f} params sha256 {digest.hexdigest()}",
          flush=True)
    dist.barrier()  # rank 0 read /status before any worker exits (the counts hold every one)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
